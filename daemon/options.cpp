// gpuqd's options from the configuration table; see options.hpp.
#include "daemon/options.hpp"

#include <CLI/CLI.hpp>

namespace gpuq::daemon {

void add_setting_options(CLI::App& app, common::Settings& settings) {
  for (const auto& k : common::setting_keys()) {
    if (k.option.empty()) continue;
    const auto value = common::setting_value(settings, k.key);
    std::string shown = value.is_string() ? value.get<std::string>() : value.is_null() ? "" : value.dump();
    if (value.is_number_float() && value.get<double>() == static_cast<double>(static_cast<std::int64_t>(value.get<double>())))
      shown = std::to_string(static_cast<std::int64_t>(value.get<double>()));  // 10, not 10.0
    const std::string help = k.help + (shown.empty() || shown == "0" || shown == "false" ? "" : " [" + shown + "]");
    auto set = [&settings, key = k.key, option = k.option](const std::string& text) {
      if (auto ok = common::apply_option(settings, key, text); !ok) {
        const std::string& m = ok.error().message;  // "--option: why"
        throw CLI::ValidationError(option, m.substr(m.find(": ") + 2));
      }
    };
    if (k.value_name.empty())  // a flag: --multi-user, or --multi-user=false over the file's true; the
      // value is the rule's to check (CLI11's own flag parsing throws on "=maybe")
      app.add_option_function<std::string>(k.option, set, help)->expected(0, 1)->type_name("");
    else
      app.add_option_function<std::string>(k.option, set, help)->type_name(k.value_name);
  }
}

}  // namespace gpuq::daemon
