// What the command registrations share (cli/commands/*.cpp): CLI11 and the --json flag.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/commands.hpp"

namespace gpuq::cli {

inline void add_json_flag(CLI::App* sub, Context& ctx) {
  sub->add_flag("--json", ctx.opt.json, "Print JSON (schema in docs/cli.md)");
}

// The values a command's options are parsed into, owned by its callback (which the App keeps).
template <class T>
std::shared_ptr<T> args() {
  return std::make_shared<T>();
}

}  // namespace gpuq::cli
