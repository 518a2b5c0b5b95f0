// gpuq-plot-png PATH: paints the chart document on standard input (plot.hpp's chart_document) as
// a PNG at PATH. gpuq runs it for `gpuq plot -o x.png` (png_client.cpp); it is a program of its
// own because it loads libcairo, which the statically linked gpuq cannot.
#include <iostream>
#include <iterator>
#include <string>

#include "cli/plot.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gpuq-plot-png FILE.png < chart.json (gpuq plot runs it)\n";
    return 2;
  }
  // Read the whole document first: gpuq writes all of it before it listens to what is said here.
  constexpr std::size_t k_max = std::size_t{1} << 30;
  std::string text;
  char buf[65536];
  while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(std::cin.gcount()));
    if (text.size() > k_max) {
      std::cerr << "the chart document is larger than 1 GiB\n";
      return 2;
    }
  }
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) {
    std::cerr << "the chart document is not JSON\n";
    return 2;
  }
  auto chart = gpuq::cli::plot::parse_chart_document(doc);
  if (!chart) {
    std::cerr << chart.error().message << "\n";
    return 2;
  }
  if (auto painted = gpuq::cli::plot::paint_png(chart->first, chart->second, argv[1]); !painted) {
    std::cerr << painted.error().message << "\n";
    return 1;
  }
  return 0;
}
