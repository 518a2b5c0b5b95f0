// libFuzzer target: one request line through everything gpuqd does with it before a handler
// runs — the depth-limited parser, then the decoder of the command it names (request_decoders(),
// which a unit test keeps equal to gpuqd's command table). A crash, a
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
    for (const auto& d : request_decoders())
      if (d.name == cmd) d.check(r);
    if (cmd == "submit") {  // what gpuqd does with a submission before a handler sees it
      auto submit = cmd::submit.decode(r);
      if (auto batch = parse_batch(submit.jobs, submit.cwd.empty() ? "/" : submit.cwd)) resolve_batch_dependencies(*batch);
    }
    (void)r.dump(-1, ' ', false, json::error_handler_t::replace);  // the daemon echoes parts of requests
  } catch (const gpuq::RequestError&) {
    // the daemon's error reply
  }
  return 0;
}
