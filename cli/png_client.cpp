// `gpuq plot -o x.png`: gpuq hands the chart to gpuq-plot-png, beside it, which paints it with
// cairo (plot_png.cpp). gpuq itself is linked statically so that it starts as fast as a bare
// process (it runs once per job in sweep scripts), and a static program cannot load a shared
// library such as libcairo safely: the first try crashed inside cairo.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli/plot.hpp"
#include "common/command.hpp"
#include "common/paths.hpp"

namespace gpuq::cli::plot {

Result<std::string> png_painter() {
#ifndef GPUQ_HAVE_CAIRO
  return Error{ErrorCode::internal, "this gpuq was built without cairo, so it cannot write PNG; write .svg instead"};
#else
  std::string path = common::self_dir() + "/gpuq-plot-png";
  if (::access(path.c_str(), X_OK) != 0)
    return Error{ErrorCode::internal,
                 "cannot write PNG: " + path + " (" + std::strerror(errno) + "); reinstall gpuq, or write .svg instead"};
  return path;
#endif
}

Result<bool> render_png(const std::string& painter, const std::vector<JobCurves>& jobs, const ChartOptions& o,
                        const std::string& path) {
  // The painter reads the chart on its standard input; a minute is far more than any chart takes.
  const auto r = common::run_command({painter, path}, 60, 4096, chart_document(jobs, o).dump());
  if (r.started && !r.timed_out && r.exit_code == 0) return true;
  std::string said = r.err;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (!r.started) said = "cannot write " + path + ": " + said;
  else if (r.timed_out) said = painter + " did not finish within a minute";
  else if (said.empty())
    said = r.signal ? painter + " died of signal " + std::to_string(r.signal)
                    : painter + " exited with code " + std::to_string(r.exit_code);
  return Error{ErrorCode::internal, said};
}

}  // namespace gpuq::cli::plot
