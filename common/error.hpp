// Error values shared by the daemon, the CLI and the tests: a code a script can branch on and a
// message a person can act on. Expected failures travel as Result<T>; request handlers throw
// RequestError, which the connection loop turns into an error reply.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpuq {

enum class ErrorCode {
  bad_request,       // malformed JSON, wrong field types, missing fields
  invalid_spec,      // a job spec failed validation
  not_found,         // unknown job id, batch or command target
  wrong_state,       // the job is not in a state the request applies to (restarting a running job)
  unknown_command,   // the request's "cmd" is not one the daemon knows
  version_mismatch,  // client and daemon speak different protocol versions
  too_large,         // a request line over the size limit
  forbidden,         // peer credentials refused
  unavailable,       // the daemon is not running or not reachable
  store_error,       // the state store could not be written (disk full, read-only)
  internal,          // a bug: reported, never fatal to the daemon
};

std::string_view to_string(ErrorCode code);
ErrorCode error_code_from_string(std::string_view text);

struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

// A value or an Error. Small on purpose: no monadic chaining, just checks at the call site.
template <class T>
class Result {
 public:
  Result(T value) : m_value(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : m_value(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(m_value); }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<T>(m_value); }
  const T& value() const { return std::get<T>(m_value); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<Error>(m_value); }

 private:
  std::variant<T, Error> m_value;
};

// Thrown by request handlers; carries the code and message of the error reply.
class RequestError : public std::runtime_error {
 public:
  RequestError(ErrorCode code, const std::string& message)
      : std::runtime_error(message), m_code(code) {}
  explicit RequestError(const Error& error) : RequestError(error.code, error.message) {}
  ErrorCode code() const { return m_code; }

 private:
  ErrorCode m_code;
};

// What a caught exception tells a client: a RequestError its code and words; anything else is a
// bug of ours, `internal`.
inline Error error_of(const std::exception& e) {
  if (const auto* r = dynamic_cast<const RequestError*>(&e)) return Error{r->code(), r->what()};
  return Error{ErrorCode::internal, std::string("internal error: ") + e.what()};
}

}  // namespace gpuq
