// `gpuq plot`: curves from progress events, the chart layout, and the SVG canvas (see plot.hpp).
#include "cli/plot.hpp"

#include "cli/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace gpuq::cli::plot {

using json = nlohmann::json;

std::optional<XAxis> parse_x_axis(const std::string& name) {
  if (name == "auto") return XAxis::automatic;
  if (name == "epoch") return XAxis::epoch;
  if (name == "step") return XAxis::step;
  if (name == "time") return XAxis::time;
  return std::nullopt;
}

std::string x_axis_name(XAxis x) {
  switch (x) {
    case XAxis::automatic: return "auto";
    case XAxis::epoch: return "epoch";
    case XAxis::step: return "step";
    case XAxis::time: return "time";
  }
  return "?";
}

namespace {

bool number(const json& d, const char* key) { return d.contains(key) && d[key].is_number(); }

// Where an event sits on the x axis, if it can.
std::optional<double> x_of(const common::Event& e, XAxis x, double t0) {
  const json& d = e.data;
  switch (x) {
    case XAxis::epoch:
      if (number(d, "step") && number(d, "total_steps") && number(d, "epochs") && d["total_steps"].get<double>() > 0)
        return d["step"].get<double>() / d["total_steps"].get<double>() * d["epochs"].get<double>();
      if (number(d, "epoch")) return d["epoch"].get<double>();
      return std::nullopt;
    case XAxis::step:
      if (number(d, "step")) return d["step"].get<double>();
      return std::nullopt;
    case XAxis::time: return e.at - t0;
    case XAxis::automatic: break;
  }
  return std::nullopt;
}

bool supports(const std::vector<common::Event>& events, XAxis x) {
  for (const auto& e : events)
    if (e.type == "progress" && x_of(e, x, 0)) return true;
  return false;
}

bool is_default_metric(const std::string& key) {
  return key.find("loss") != std::string::npos || key.find("acc") != std::string::npos;
}

bool is_eval_metric(const std::string& m) {
  return m.rfind("test", 0) == 0 || m.rfind("val", 0) == 0 || m.rfind("eval", 0) == 0;
}

// The panel a metric is drawn in.
std::string panel_of(const std::string& m) {
  if (m.find("loss") != std::string::npos) return "loss";
  if (m.find("acc") != std::string::npos) return "accuracy";
  return m;
}

const Rgb k_palette[] = {{0.306, 0.475, 0.655}, {0.949, 0.557, 0.169}, {0.882, 0.341, 0.349}, {0.463, 0.718, 0.698},
                         {0.349, 0.631, 0.310}, {0.929, 0.788, 0.282}, {0.690, 0.478, 0.631}, {1.000, 0.616, 0.655},
                         {0.612, 0.459, 0.373}, {0.729, 0.690, 0.675}};
const Rgb k_ink{0.15, 0.15, 0.15}, k_grid{0.88, 0.88, 0.88}, k_muted{0.4, 0.4, 0.4}, k_white{1, 1, 1};

Rgb color_of(std::size_t job_index) { return k_palette[job_index % std::size(k_palette)]; }

std::vector<std::string> panels_of(const std::vector<JobCurves>& jobs) {
  std::vector<std::string> panels;
  for (const auto& j : jobs)
    for (const auto& c : j.curves)
      if (std::find(panels.begin(), panels.end(), panel_of(c.metric)) == panels.end())
        panels.push_back(panel_of(c.metric));
  // Losses first, then accuracies, then the rest in first-seen order.
  std::stable_sort(panels.begin(), panels.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& p) { return p == "loss" ? 0 : p == "accuracy" ? 1 : 2; };
    return rank(a) < rank(b);
  });
  return panels;
}

constexpr double k_title_h = 56, k_margin_left = 78, k_legend_w = 260, k_margin_right = 24, k_panel_gap = 18;

}  // namespace

std::optional<XAxis> common_x_axis(const std::vector<std::vector<common::Event>>& jobs, XAxis wanted) {
  std::vector<XAxis> order = wanted == XAxis::automatic ? std::vector<XAxis>{XAxis::epoch, XAxis::step, XAxis::time}
                                                        : std::vector<XAxis>{wanted};
  for (XAxis x : order) {
    bool all = true;
    for (const auto& events : jobs) all = all && supports(events, x);
    if (all) return x;
  }
  return std::nullopt;
}

JobCurves curves_from_events(std::int64_t id, const std::string& name, const std::vector<common::Event>& events,
                             XAxis x, const std::vector<std::string>& metrics) {
  JobCurves out{id, name, {}};
  int rank = std::numeric_limits<int>::max();
  double t0 = std::numeric_limits<double>::max();
  for (const auto& e : events)
    if (e.type == "progress") rank = std::min(rank, e.rank), t0 = std::min(t0, e.at);
  std::map<std::string, std::size_t> index;
  auto curve = [&](const std::string& m) -> Curve& {
    auto [it, fresh] = index.emplace(m, out.curves.size());
    if (fresh) out.curves.push_back({m, {}});
    return out.curves[it->second];
  };
  for (const auto& m : metrics) curve(m);  // asked-for metrics keep the order they were asked in
  for (const auto& e : events) {
    if (e.type != "progress" || e.rank != rank || !e.data.is_object()) continue;
    auto px = x_of(e, x, t0);
    if (!px) continue;
    const auto drawable = [](double v) { return std::isfinite(v) && std::abs(v) <= k_plot_limit; };
    for (const auto& [k, v] : e.data.items()) {
      if (!v.is_number()) continue;
      if (metrics.empty() ? !is_default_metric(k) : !index.count(k)) continue;
      const double y = v.get<double>();
      if (drawable(y) && drawable(*px)) curve(k).points.push_back({*px, y});
      else ++out.skipped;
    }
  }
  std::erase_if(out.curves, [](const Curve& c) { return c.points.empty(); });
  return out;
}

Ticks nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {  // one value: a unit-sized window around it
    const double pad = std::abs(hi) > 0 ? std::abs(hi) * 0.1 : 1;
    lo -= pad, hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= f * mag * (1 + 1e-9)) {
      step = f * mag;
      break;
    }
  Ticks t;
  t.step = step;
  t.lo = std::floor(lo / step + 1e-9) * step;
  t.hi = std::ceil(hi / step - 1e-9) * step;
  for (double v = t.lo; v <= t.hi + step * 1e-6; v += step) t.values.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string tick_label(double v, double step) {
  char buf[64];
  if (step <= 0) {  // log-scale ticks: 1e5 for big and small decades, else plain
    const double e = std::round(std::log10(std::abs(v)));
    if (v > 0 && std::abs(e) >= 4 && std::abs(v - std::pow(10.0, e)) < 1e-9 * v) std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(e));
    else std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }
  int decimals = 0;
  while (decimals < 8 && std::abs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6)
    ++decimals;
  if (std::abs(v) >= 1e6 || (std::abs(v) > 0 && std::abs(v) < 1e-4)) std::snprintf(buf, sizeof buf, "%.3g", v);
  else std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

int chart_height(const std::vector<JobCurves>& jobs, const ChartOptions& o) {
  const auto n = std::max<std::size_t>(1, panels_of(jobs).size());
  return static_cast<int>(k_title_h + n * (o.panel_height + k_panel_gap) + 8);
}

namespace {

// `text` shortened with "…" (at a UTF-8 boundary) until it fits `width` at `size`.
std::string fit_text(Canvas& c, const std::string& text, double size, double width) {
  std::string shown = text;
  for (std::size_t k = text.size(); k > 1 && c.text_width(shown, size) > width;) {
    do --k;
    while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80);
    shown = text.substr(0, k) + "…";
  }
  return shown;
}

}  // namespace

std::vector<Point> decimate(const std::vector<Point>& pts) {
  // Points sharing a pixel column collapse to their first, lowest, highest and last: the drawn
  // line looks the same, and 100,000 steps make a few thousand points instead of a huge file.
  if (pts.size() < 4) return pts;
  std::vector<Point> out;
  std::size_t i = 0;
  while (i < pts.size()) {
    const double column = std::floor(pts[i].x);
    std::size_t lo = i, hi = i, j = i;
    for (; j < pts.size() && std::floor(pts[j].x) == column; ++j) {
      if (pts[j].y < pts[lo].y) lo = j;
      if (pts[j].y > pts[hi].y) hi = j;
    }
    std::size_t keep[] = {i, std::min(lo, hi), std::max(lo, hi), j - 1};
    for (std::size_t k = 0; k < 4; ++k)
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(pts[keep[k]]);
    i = j;
  }
  return out;
}

namespace {

// Log-scale ticks: every decade, plus 2 and 5 times it when the range spans few decades.
Ticks log_ticks(double lo, double hi) {
  Ticks t;
  t.lo = std::pow(10.0, std::floor(std::log10(lo)));
  t.hi = std::pow(10.0, std::ceil(std::log10(hi)));
  if (t.hi <= t.lo) t.hi = t.lo * 10;
  const double decades = std::log10(t.hi / t.lo);
  const int stride = decades > 8 ? static_cast<int>(std::ceil(decades / 8)) : 1;
  int i = 0;
  for (double d = t.lo; d <= t.hi * 1.0001; d *= 10, ++i) {
    if (i % stride == 0) t.values.push_back(d);
    if (decades <= 2 && d * 2 < t.hi) t.values.push_back(d * 2);
    if (decades <= 2 && d * 5 < t.hi) t.values.push_back(d * 5);
  }
  std::sort(t.values.begin(), t.values.end());
  t.step = 0;  // tick_label: significant digits
  return t;
}

}  // namespace

bool wants_log_scale(const std::string& panel, double ylo, double yhi, bool forced) {
  if (!(ylo > 0) || !std::isfinite(yhi)) return false;  // zero or negative values: linear only
  return forced || (panel == "loss" && yhi / ylo >= 1000);
}

void draw_chart(Canvas& c, const std::vector<JobCurves>& jobs, const ChartOptions& o) {
  const double W = o.width, H = chart_height(jobs, o);
  c.rect(0, 0, W, H, k_white);
  c.text({W / 2, 34}, fit_text(c, o.title, 20, W - 40), 20, Anchor::middle, k_ink, true);
  int skipped = 0;
  for (const auto& j : jobs) skipped += j.skipped;
  if (skipped > 0)  // said, not hidden: a curve with a gap where the training blew up
    c.text({W / 2, 50}, std::to_string(skipped) + " value(s) not drawn: not finite, or beyond ±1e150", 11,
           Anchor::middle, k_ink);
  const auto panels = panels_of(jobs);
  if (panels.empty()) {
    c.text({W / 2, H / 2}, "no progress events to plot", 16, Anchor::middle, k_muted);
    return;
  }
  const double px0 = k_margin_left, px1 = W - k_legend_w - k_margin_right;
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const std::string& panel = panels[p];
    const double top = k_title_h + static_cast<double>(p) * (o.panel_height + k_panel_gap);
    const double py0 = top + 28, py1 = top + o.panel_height - 44;  // plot area, y grows down

    // Ranges over this panel's curves; a log scale for losses spanning 3+ decades (a diverged run)
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    std::vector<std::string> metrics;  // of this panel, first-seen order
    for (const auto& j : jobs)
      for (const auto& cv : j.curves) {
        if (panel_of(cv.metric) != panel) continue;
        if (std::find(metrics.begin(), metrics.end(), cv.metric) == metrics.end()) metrics.push_back(cv.metric);
        for (auto pt : cv.points) xlo = std::min(xlo, pt.x), xhi = std::max(xhi, pt.x), ylo = std::min(ylo, pt.y), yhi = std::max(yhi, pt.y);
      }
    const bool log_y = wants_log_scale(panel, ylo, yhi, o.log_y);
    if (!log_y && panel == "accuracy" && ylo >= 0 && yhi <= 1)  // fractions: up to 1 exactly, a little room below
      ylo = std::max(0.0, ylo - std::max(0.05, (1 - ylo) * 0.1)), yhi = 1;
    const Ticks xt = nice_ticks(std::min(xlo, 0.0), xhi, 8);
    const Ticks yt = log_y ? log_ticks(ylo, yhi) : nice_ticks(ylo, yhi, 5);
    auto X = [&](double x) { return px0 + (x - xt.lo) / (xt.hi - xt.lo) * (px1 - px0); };
    auto Y = [&](double y) {
      const double f = log_y ? std::log10(y / yt.lo) / std::log10(yt.hi / yt.lo) : (y - yt.lo) / (yt.hi - yt.lo);
      return py1 - f * (py1 - py0);
    };

    // Panel title, grid, ticks, axis labels
    c.text({px0, top + 16}, panel + (log_y ? "  (log scale)" : ""), 15, Anchor::start, k_ink, true);
    for (double v : yt.values) {
      c.polyline({{px0, Y(v)}, {px1, Y(v)}}, k_grid, 1, false, "", 0, "");
      c.text({px0 - 8, Y(v) + 4}, tick_label(v, yt.step), 12, Anchor::end, k_muted);
    }
    for (double v : xt.values) {
      c.polyline({{X(v), py0}, {X(v), py1}}, k_grid, 1, false, "", 0, "");
      c.text({X(v), py1 + 18}, tick_label(v, xt.step), 12, Anchor::middle, k_muted);
    }
    c.frame(px0, py0, px1 - px0, py1 - py0, k_muted);
    c.text({(px0 + px1) / 2, py1 + 36}, x_axis_name(o.x) + (o.x == XAxis::time ? " (s)" : ""), 13, Anchor::middle, k_ink);

    // Curves: a colour per job; evaluation metrics dashed with dots (they are sparse)
    std::vector<std::size_t> shown_jobs;
    for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
      const auto& j = jobs[ji];
      bool any = false;
      for (const auto& cv : j.curves) {
        if (panel_of(cv.metric) != panel) continue;
        const bool eval = is_eval_metric(cv.metric);
        std::vector<Point> pts;
        for (auto pt : cv.points) pts.push_back({X(pt.x), Y(pt.y)});
        pts = decimate(pts);
        const std::string label = "#" + std::to_string(j.id) + " " + j.name + "  " + cv.metric;
        c.polyline(pts, color_of(ji), eval ? 2.2 : 1.6, eval, label, j.id, cv.metric);
        if (eval || pts.size() == 1)
          for (auto pt : pts) c.dot(pt, 3.2, color_of(ji));
        any = true;
      }
      if (any) shown_jobs.push_back(ji);
    }

    // Legend, right of the plot: the jobs by colour, then the metrics by line style
    const double lx = px1 + 18, row = 18;
    const auto rows = static_cast<std::size_t>((py1 - py0) / row);
    const std::size_t job_rows = rows > metrics.size() + 2 ? rows - metrics.size() - 1 : 1;
    double ly = py0 + 8;
    for (std::size_t k = 0; k < shown_jobs.size(); ++k) {
      if (k + 1 == job_rows && shown_jobs.size() > job_rows) {
        c.text({lx + 34, ly + 4}, "… " + std::to_string(shown_jobs.size() - k) + " more jobs", 12, Anchor::start, k_muted);
        ly += row;
        break;
      }
      const auto& j = jobs[shown_jobs[k]];
      c.polyline({{lx, ly}, {lx + 26, ly}}, color_of(shown_jobs[k]), 3, false, "", 0, "");
      c.text({lx + 34, ly + 4}, fit_text(c, "#" + std::to_string(j.id) + " " + j.name, 12, k_legend_w - 40), 12,
             Anchor::start, k_ink);
      ly += row;
    }
    ly += row / 2;
    for (const auto& m : metrics) {
      if (ly > py1) break;
      const bool eval = is_eval_metric(m);
      c.polyline({{lx, ly}, {lx + 26, ly}}, k_muted, eval ? 2.2 : 1.6, eval, "", 0, "");
      if (eval) c.dot({lx + 13, ly}, 3.2, k_muted);
      c.text({lx + 34, ly + 4}, fit_text(c, m, 12, k_legend_w - 40), 12, Anchor::start, k_ink);
      ly += row;
    }
  }
}

// ---- SVG ----------------------------------------------------------------------------------------

namespace {

// Text as XML 1.0 takes it: markup escaped, and only the characters it allows (tab, and U+0020 to
// U+D7FF, U+E000 to U+FFFD, U+10000 up; no other control character, no U+FFFE/U+FFFF); anything
// else, bytes that are not UTF-8 included, becomes U+FFFD. One bad metric name made the file
// unreadable.
std::string esc(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    std::size_t n = utf8_decode(s, i, cp);
    const bool allowed = n > 0 && (cp == '\t' || (cp >= 0x20 && cp <= 0xD7FF) || (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000);
    if (!allowed) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += n > 0 ? n : 1;
      continue;
    }
    switch (cp) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.append(s, i, n);
    }
    i += n;
  }
  return out;
}

std::string hex(Rgb c) {
  char buf[8];
  auto b = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * 255)); };
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", b(c.r), b(c.g), b(c.b));
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

class SvgCanvas final : public Canvas {
 public:
  std::ostringstream out;

  void rect(double x, double y, double w, double h, Rgb fill) override {
    out << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\"" << num(h)
        << "\" fill=\"" << hex(fill) << "\"/>\n";
  }
  void frame(double x, double y, double w, double h, Rgb stroke) override {
    out << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\"" << num(h)
        << "\" fill=\"none\" stroke=\"" << hex(stroke) << "\"/>\n";
  }
  void polyline(const std::vector<Point>& pts, Rgb color, double width, bool dashed, const std::string& series,
                std::int64_t job, const std::string& metric) override {
    out << "<polyline";
    if (!series.empty())
      out << " class=\"series\" data-job=\"" << job << "\" data-metric=\"" << esc(metric) << "\"";
    out << " fill=\"none\" stroke=\"" << hex(color) << "\" stroke-width=\"" << num(width) << "\""
        << (dashed ? " stroke-dasharray=\"6 4\"" : "") << " stroke-linejoin=\"round\" points=\"";
    for (std::size_t i = 0; i < pts.size(); ++i) out << (i ? " " : "") << num(pts[i].x) << "," << num(pts[i].y);
    out << "\">";
    if (!series.empty()) out << "<title>" << esc(series) << "</title>";
    out << "</polyline>\n";
  }
  void dot(Point p, double radius, Rgb color) override {
    out << "<circle cx=\"" << num(p.x) << "\" cy=\"" << num(p.y) << "\" r=\"" << num(radius) << "\" fill=\""
        << hex(color) << "\"/>\n";
  }
  void text(Point p, const std::string& s, double size, Anchor a, Rgb color, bool bold, bool vertical) override {
    const char* anchor = a == Anchor::start ? "start" : a == Anchor::middle ? "middle" : "end";
    out << "<text x=\"" << num(p.x) << "\" y=\"" << num(p.y) << "\" font-size=\"" << num(size) << "\" text-anchor=\""
        << anchor << "\" fill=\"" << hex(color) << "\"" << (bold ? " font-weight=\"bold\"" : "");
    if (vertical) out << " transform=\"rotate(-90 " << num(p.x) << " " << num(p.y) << ")\"";
    out << ">" << esc(s) << "</text>\n";
  }
  double text_width(const std::string& s, double size) override {
    std::size_t chars = 0;
    for (unsigned char ch : s) chars += (ch & 0xC0) != 0x80;  // UTF-8 code points
    return 0.56 * size * static_cast<double>(chars);
  }
};

}  // namespace

std::string render_svg(const std::vector<JobCurves>& jobs, const ChartOptions& o) {
  SvgCanvas c;
  const int h = chart_height(jobs, o);
  c.out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << o.width
        << "\" height=\"" << h << "\" viewBox=\"0 0 " << o.width << " " << h
        << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  draw_chart(c, jobs, o);
  c.out << "</svg>\n";
  return c.out.str();
}

json chart_document(const std::vector<JobCurves>& jobs, const ChartOptions& o) {
  json doc_jobs = json::array();
  for (const auto& j : jobs) {
    json curves = json::array();
    for (const auto& c : j.curves) {
      json xs = json::array(), ys = json::array();
      for (const auto& p : c.points) xs.push_back(p.x), ys.push_back(p.y);
      curves.push_back({{"metric", c.metric}, {"x", std::move(xs)}, {"y", std::move(ys)}});
    }
    doc_jobs.push_back({{"id", j.id}, {"name", j.name}, {"curves", std::move(curves)}, {"skipped", j.skipped}});
  }
  return {{"jobs", std::move(doc_jobs)},
          {"title", o.title},
          {"x", x_axis_name(o.x)},
          {"width", o.width},
          {"panel_height", o.panel_height},
          {"log_y", o.log_y}};
}

Result<std::pair<std::vector<JobCurves>, ChartOptions>> parse_chart_document(const json& doc) {
  auto bad = [](const std::string& what) { return Error{ErrorCode::bad_request, "chart document: " + what}; };
  try {
    ChartOptions o;
    o.title = doc.at("title").get<std::string>();
    const auto x = parse_x_axis(doc.at("x").get<std::string>());
    if (!x) return bad("unknown x axis");
    o.x = *x;
    o.width = doc.at("width").get<int>();
    o.panel_height = doc.at("panel_height").get<int>();
    o.log_y = doc.at("log_y").get<bool>();
    // The sizes of a picture someone would look at: cairo allocates width x height pixels at once.
    if (o.width < 100 || o.width > 20000 || o.panel_height < 50 || o.panel_height > 5000)
      return bad("width or panel height out of range");
    std::vector<JobCurves> jobs;
    for (const auto& j : doc.at("jobs")) {
      JobCurves jc{j.at("id").get<std::int64_t>(), j.at("name").get<std::string>(), {}, j.value("skipped", 0)};
      if (jc.skipped < 0) return bad("a negative count of skipped values");
      for (const auto& c : j.at("curves")) {
        const auto& xs = c.at("x");
        const auto& ys = c.at("y");
        if (!xs.is_array() || !ys.is_array() || xs.size() != ys.size()) return bad("a curve's x and y differ in length");
        Curve curve{c.at("metric").get<std::string>(), {}};
        for (std::size_t i = 0; i < xs.size(); ++i) {
          const Point p{xs[i].get<double>(), ys[i].get<double>()};
          if (!(std::abs(p.x) <= k_plot_limit && std::abs(p.y) <= k_plot_limit))
            return bad("a value beyond ±1e150 (curves_from_events leaves those out)");
          curve.points.push_back(p);
        }
        jc.curves.push_back(std::move(curve));
      }
      jobs.push_back(std::move(jc));
    }
    if (chart_height(jobs, o) > 100000) return bad("too many panels");
    return std::pair{std::move(jobs), std::move(o)};
  } catch (const json::exception& e) {
    return bad(e.what());
  }
}

}  // namespace gpuq::cli::plot
