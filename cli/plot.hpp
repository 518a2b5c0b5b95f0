// `gpuq plot`: training curves of one or more jobs on one chart, as SVG or PNG.
// The chart is laid out once against a small Canvas interface; SvgCanvas writes SVG text (series
// carry data-job/data-metric attributes), PngCanvas (plot_png.cpp, cairo) paints pixels. The data
// side (curves from progress events, axis ticks) is pure and unit-tested.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli::plot {

struct Point {
  double x = 0, y = 0;
};

// The x axis: auto picks epoch (fractional, from step/total_steps), else step, else time.
enum class XAxis { automatic, epoch, step, time };
std::optional<XAxis> parse_x_axis(const std::string& name);
std::string x_axis_name(XAxis x);

struct Curve {
  std::string metric;  // the progress field, e.g. "loss", "test_accuracy"
  std::vector<Point> points;
};

struct JobCurves {
  std::int64_t id = 0;
  std::string name;
  std::vector<Curve> curves;  // in first-seen order of the metrics
  int skipped = 0;            // values not drawn: not finite, or beyond ±k_plot_limit
};

// Values beyond it are not drawn (and counted): one of 1e308 and one of -1e308 make a range no
// double holds, and every point of the panel NaN.
constexpr double k_plot_limit = 1e150;

// The x axis every job's events support (`wanted` unless automatic); none if they share none.
std::optional<XAxis> common_x_axis(const std::vector<std::vector<common::Event>>& jobs, XAxis wanted);

// One curve per metric from a job's progress events, rank 0's only (or the lowest rank seen).
// `metrics` empty: every numeric field whose name contains "loss" or "acc". Non-finite values, and
// those beyond ±k_plot_limit (x or y), are skipped and counted.
JobCurves curves_from_events(std::int64_t id, const std::string& name, const std::vector<common::Event>& events,
                             XAxis x, const std::vector<std::string>& metrics);

// Axis ticks at 1, 2 or 5 × 10^k covering [lo, hi] with about `target` intervals.
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, int target);
std::string tick_label(double v, double step);  // step 0: log-scale tick

struct Rgb {
  double r = 0, g = 0, b = 0;
};
enum class Anchor { start, middle, end };

class Canvas {
 public:
  virtual ~Canvas() = default;
  virtual void rect(double x, double y, double w, double h, Rgb fill) = 0;
  virtual void frame(double x, double y, double w, double h, Rgb stroke) = 0;
  // A polyline; `series` names it for readers of the output ("job 7 loss"), may be empty.
  virtual void polyline(const std::vector<Point>& pts, Rgb color, double width, bool dashed, const std::string& series,
                        std::int64_t job, const std::string& metric) = 0;
  virtual void dot(Point p, double radius, Rgb color) = 0;
  virtual void text(Point p, const std::string& s, double size, Anchor a, Rgb color, bool bold = false,
                    bool vertical = false) = 0;
  virtual double text_width(const std::string& s, double size) = 0;
};

struct ChartOptions {
  std::string title;
  XAxis x = XAxis::epoch;
  int width = 1100;
  int panel_height = 320;
  bool log_y = false;  // log scale on every panel whose values are all > 0 (losses get one anyway
                       // when they span 3 decades or more)
};

// Pixel-space points reduced to at most 4 per pixel column (first, min, max, last), in order.
std::vector<Point> decimate(const std::vector<Point>& pts);

// Whether a panel is drawn on a log scale.
bool wants_log_scale(const std::string& panel, double ylo, double yhi, bool forced);

// Panels: one for losses, one for accuracies, one per other metric; a colour per job, solid
// lines for training metrics and dashed lines with dots for test/validation ones.
int chart_height(const std::vector<JobCurves>& jobs, const ChartOptions& o);
void draw_chart(Canvas& c, const std::vector<JobCurves>& jobs, const ChartOptions& o);

std::string render_svg(const std::vector<JobCurves>& jobs, const ChartOptions& o);

// PNGs are painted by a program of their own, gpuq-plot-png (plot_png.cpp), beside gpuq: cairo is
// a shared library, and gpuq is linked statically (it starts faster), so it cannot load one.
// The chart travels to it as one JSON document on its standard input.
nlohmann::json chart_document(const std::vector<JobCurves>& jobs, const ChartOptions& o);
// The chart a document holds; an error names what is wrong with it.
Result<std::pair<std::vector<JobCurves>, ChartOptions>> parse_chart_document(const nlohmann::json& doc);

// gpuq-plot-png's path, beside the running gpuq; an error when this build has none (no cairo) or it
// is missing (png_client.cpp).
Result<std::string> png_painter();
// Has the painter write the PNG; an error carries what it said.
Result<bool> render_png(const std::string& painter, const std::vector<JobCurves>& jobs, const ChartOptions& o,
                        const std::string& path);
// Paints the PNG in this process, with cairo: gpuq-plot-png's work.
Result<bool> paint_png(const std::vector<JobCurves>& jobs, const ChartOptions& o, const std::string& path);

}  // namespace gpuq::cli::plot
