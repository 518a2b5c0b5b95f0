// libFuzzer target: a job-spec document (what `gpuq submit FILE` sends) through the validator.
// Besides "no crash", it checks the invariant the store relies on: a spec that validates is
// stored as to_json(spec), and that stored form must parse back to the same job (with the same
// train section), or a restarted daemon would run something else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "common/protocol.hpp"
#include "common/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuq::common;
  auto doc = parse_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!doc) return 0;
  auto batch = parse_batch(*doc, "/work");
  if (!batch) return 0;
  resolve_batch_dependencies(*batch);
  for (const auto& spec : *batch) {
    const json stored = to_json(spec);
    auto again = parse_job(stored, "/elsewhere");
    if (!again || to_json(*again) != stored || again->command != spec.command) {
      std::cerr << "stored spec does not round-trip:\n" << stored.dump(2) << "\n"
                << (again ? to_json(*again).dump(2) : again.error().message) << "\n";
      std::abort();
    }
  }
  return 0;
}
