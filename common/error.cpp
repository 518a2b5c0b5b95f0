// String forms of error codes: they are part of the wire protocol (docs/protocol.md).
#include "common/error.hpp"

#include <array>

namespace gpuq {

namespace {
constexpr std::array<std::pair<ErrorCode, std::string_view>, 11> k_names{{
    {ErrorCode::bad_request, "bad_request"},
    {ErrorCode::invalid_spec, "invalid_spec"},
    {ErrorCode::not_found, "not_found"},
    {ErrorCode::wrong_state, "wrong_state"},
    {ErrorCode::unknown_command, "unknown_command"},
    {ErrorCode::version_mismatch, "version_mismatch"},
    {ErrorCode::too_large, "too_large"},
    {ErrorCode::forbidden, "forbidden"},
    {ErrorCode::unavailable, "unavailable"},
    {ErrorCode::store_error, "store_error"},
    {ErrorCode::internal, "internal"},
}};
}  // namespace

std::string_view to_string(ErrorCode code) {
  for (const auto& [c, name] : k_names)
    if (c == code) return name;
  return "internal";
}

ErrorCode error_code_from_string(std::string_view text) {
  for (const auto& [c, name] : k_names)
    if (name == text) return c;
  return ErrorCode::internal;
}

}  // namespace gpuq
