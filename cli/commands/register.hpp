// What the command registrations share (cli/commands/*.cpp): CLI11 and the --json flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"

namespace gpuq::cli {

inline void add_json_flag(CLI::App* sub, Context& ctx) {
  sub->add_flag("--json", ctx.opt.json, "Print JSON (schema in docs/cli.md)");
}

// The job ids and --batch that many commands take (cancel, restart, hold, update, clean, wait,
// results, plot), with what each says of them.
struct Selection {
  std::vector<std::int64_t> ids;
  std::int64_t batch = 0;
};
inline void add_selection(CLI::App* sub, Selection& s, const std::string& ids_help,
                          const std::string& batch_help = "Every job of this batch (besides any ids)") {
  sub->add_option("ids", s.ids, ids_help);
  sub->add_option("--batch,-b", s.batch, batch_help);
}

// The values a command's options are parsed into, owned by its callback (which the App keeps).
template <class T>
std::shared_ptr<T> args() {
  return std::make_shared<T>();
}

}  // namespace gpuq::cli
