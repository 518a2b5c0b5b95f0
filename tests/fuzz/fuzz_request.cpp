// libFuzzer target: one request line through everything gpuqd does with it before a handler
// runs — the depth-limited parser, then the decoder of the command it names. A crash, a
// sanitizer report or an exception other than RequestError is a bug: the daemon must answer
// every line with a reply.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.hpp"
#include "common/protocol.hpp"
#include "common/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuq::common;
  auto request = parse_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!request || !request->is_object()) return 0;
  const json& r = *request;
  const auto cmd = r.contains("cmd") && r["cmd"].is_string() ? r["cmd"].get<std::string>() : "";
  try {
    if (cmd == "hello") decode_hello(r);
    else if (cmd == "status") decode_status(r);
    else if (cmd == "show") decode_id(r);
    else if (cmd == "cancel" || cmd == "wait") decode_ids(r);
    else if (cmd == "results") decode_results(r);
    else if (cmd == "restart") decode_restart(r);
    else if (cmd == "hold" || cmd == "release") decode_select(r);
    else if (cmd == "clean") decode_clean(r);
    else if (cmd == "update") decode_update(r);
    else if (cmd == "drain" || cmd == "undrain") decode_drain(r);
    else if (cmd == "submit") {
      auto submit = decode_submit(r);
      if (auto batch = parse_batch(submit.jobs, submit.cwd.empty() ? "/" : submit.cwd)) resolve_batch_dependencies(*batch);
    }
    (void)r.dump(-1, ' ', false, json::error_handler_t::replace);  // the daemon echoes parts of requests
  } catch (const gpuq::RequestError&) {
    // the daemon's error reply
  }
  return 0;
}
