// gpuqd's command-line options for the configuration table's keys (common/config.hpp).
#pragma once

#include "common/config.hpp"

namespace CLI {
class App;
}

namespace gpuq::daemon {

// Adds one option for each key of the configuration table that names one: it takes what the key's
// file value takes (checked by the same rule; a duration may say its unit) and stores it into
// `settings` with the option as its source; its help shows the value in effect before the command
// line. `settings` must outlive the parse.
void add_setting_options(CLI::App& app, common::Settings& settings);

}  // namespace gpuq::daemon
