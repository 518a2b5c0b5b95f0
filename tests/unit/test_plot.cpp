#include <doctest/doctest.h>

#include <cmath>

#include "cli/plot.hpp"

using namespace gpuq::cli::plot;
using gpuq::common::Event;
using json = nlohmann::json;

namespace {

// Progress like gpuq-worker's: per-step loss, per-epoch test metrics.
std::vector<Event> training_events(int rank, int epochs, int steps_per_epoch) {
  std::vector<Event> ev;
  std::int64_t seq = 0;
  for (int e = 1; e <= epochs; ++e) {
    for (int s = 1; s <= steps_per_epoch; ++s) {
      const int step = (e - 1) * steps_per_epoch + s;
      ev.push_back({++seq, rank, "progress", 100.0 + step,
                    {{"epoch", e}, {"epochs", epochs}, {"step", step}, {"total_steps", epochs * steps_per_epoch},
                     {"loss", 1.0 / step}, {"samples_per_s", 1000}}});
    }
    ev.push_back({++seq, rank, "progress", 100.0 + e * steps_per_epoch,
                  {{"epoch", e}, {"epochs", epochs}, {"step", e * steps_per_epoch}, {"total_steps", epochs * steps_per_epoch},
                   {"loss", 0.5}, {"test_loss", 0.6}, {"test_accuracy", 0.7 + 0.1 * e}}});
  }
  return ev;
}

const Curve* find(const JobCurves& j, const std::string& metric) {
  for (const auto& c : j.curves)
    if (c.metric == metric) return &c;
  return nullptr;
}

}  // namespace

TEST_SUITE_BEGIN("plot");

TEST_CASE("curves: the loss and accuracy fields by default, x in fractional epochs") {
  auto ev = training_events(0, 2, 4);
  auto j = curves_from_events(7, "a", ev, XAxis::epoch, {});
  CHECK(j.curves.size() == 3);  // loss, test_loss, test_accuracy; not samples_per_s
  const Curve* loss = find(j, "loss");
  REQUIRE(loss);
  CHECK(loss->points.size() == 10);  // 8 steps + 2 epoch ends
  CHECK(loss->points[0].x == doctest::Approx(0.25));
  CHECK(loss->points[0].y == doctest::Approx(1.0));
  const Curve* acc = find(j, "test_accuracy");
  REQUIRE(acc);
  REQUIRE(acc->points.size() == 2);
  CHECK(acc->points[1].x == doctest::Approx(2.0));
  CHECK(acc->points[1].y == doctest::Approx(0.9));
  CHECK_FALSE(find(j, "samples_per_s"));
}

TEST_CASE("curves: named metrics only, rank 0 only, non-finite values skipped") {
  auto ev = training_events(0, 1, 3);
  auto other = training_events(1, 1, 3);
  for (auto& e : other) e.data["samples_per_s"] = 5;
  ev.insert(ev.end(), other.begin(), other.end());
  ev.push_back({99, 0, "progress", 200, {{"step", 9}, {"samples_per_s", std::nan("")}}});
  auto j = curves_from_events(1, "a", ev, XAxis::step, {"samples_per_s"});
  REQUIRE(j.curves.size() == 1);
  CHECK(j.curves[0].metric == "samples_per_s");
  CHECK(j.curves[0].points.size() == 3);  // rank 0's 3 steps (epoch ends carry no rate); rank 1 and NaN left out
  for (auto p : j.curves[0].points) CHECK(p.y == 1000);
}

TEST_CASE("x axis: auto takes the first axis every job supports") {
  std::vector<Event> steps_only{{1, 0, "progress", 5, {{"step", 1}, {"loss", 1}}}};
  std::vector<Event> times_only{{1, 0, "progress", 5, {{"loss", 1}}}};
  auto full = training_events(0, 1, 2);
  CHECK(common_x_axis({full, full}, XAxis::automatic) == XAxis::epoch);
  CHECK(common_x_axis({full, steps_only}, XAxis::automatic) == XAxis::step);
  CHECK(common_x_axis({full, times_only}, XAxis::automatic) == XAxis::time);
  CHECK_FALSE(common_x_axis({times_only}, XAxis::step).has_value());
  CHECK(parse_x_axis("epoch") == XAxis::epoch);
  CHECK_FALSE(parse_x_axis("epochs").has_value());
}

TEST_CASE("nice ticks cover the range at 1-2-5 steps") {
  auto t = nice_ticks(0.013, 0.97, 5);
  CHECK(t.step == doctest::Approx(0.2));
  CHECK(t.lo == doctest::Approx(0.0));
  CHECK(t.hi == doctest::Approx(1.0));
  CHECK(t.values.size() == 6);
  auto w = nice_ticks(0, 2400, 8);
  CHECK(w.step == doctest::Approx(500));  // 300 per interval rounds up to 500
  CHECK(w.hi == doctest::Approx(2500));
  auto flat = nice_ticks(3, 3, 5);  // one value: still a window around it
  CHECK(flat.lo < 3);
  CHECK(flat.hi > 3);
  CHECK(tick_label(0.25, 0.05) == "0.25");
  CHECK(tick_label(2000, 500) == "2000");
  CHECK(tick_label(0.5, 0.25) == "0.50");
}

TEST_CASE("svg: one named polyline per job and metric, names escaped, panels for loss and accuracy") {
  std::vector<JobCurves> jobs{curves_from_events(3, "a<b>&\"c\"", training_events(0, 2, 4), XAxis::epoch, {}),
                              curves_from_events(4, "second", training_events(0, 3, 2), XAxis::epoch, {})};
  ChartOptions o;
  o.title = "t";
  const std::string svg = render_svg(jobs, o);
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  std::size_t series = 0;
  for (std::size_t p = 0; (p = svg.find("class=\"series\"", p)) != std::string::npos; ++p) ++series;
  CHECK(series == 6);
  CHECK(svg.find("data-job=\"4\" data-metric=\"test_accuracy\"") != std::string::npos);
  CHECK(svg.find("a&lt;b&gt;&amp;&quot;c&quot;") != std::string::npos);
  CHECK(svg.find("a<b>") == std::string::npos);
  CHECK(svg.find(">loss</text>") != std::string::npos);
  CHECK(svg.find(">accuracy</text>") != std::string::npos);
  CHECK(chart_height(jobs, o) > 2 * o.panel_height);
}

TEST_CASE("log scale: for losses spanning 3 decades, or when asked, never for values <= 0") {
  CHECK(wants_log_scale("loss", 0.01, 1e12, false));
  CHECK_FALSE(wants_log_scale("loss", 0.1, 2.5, false));
  CHECK(wants_log_scale("loss", 0.1, 2.5, true));
  CHECK_FALSE(wants_log_scale("accuracy", 0.001, 1, false));
  CHECK_FALSE(wants_log_scale("loss", 0, 1e9, true));
  CHECK(tick_label(1e-3, 0) == "0.001");
  CHECK(tick_label(1e12, 0) == "1e12");
  CHECK(tick_label(1e-5, 0) == "1e-5");
  CHECK(tick_label(500, 0) == "500");
  // A diverged run next to a healthy one: the loss panel says log scale and its ticks are decades
  auto healthy = training_events(0, 2, 4);
  auto diverged = training_events(0, 2, 4);
  for (auto& e : diverged) e.data["loss"] = 1e9;
  std::vector<JobCurves> jobs{curves_from_events(1, "ok", healthy, XAxis::epoch, {}),
                              curves_from_events(2, "boom", diverged, XAxis::epoch, {})};
  const std::string svg = render_svg(jobs, ChartOptions{});
  CHECK(svg.find(">loss  (log scale)</text>") != std::string::npos);
  CHECK(svg.find(">1e9</text>") != std::string::npos);
  CHECK(svg.find(">0.1</text>") != std::string::npos);
}

TEST_CASE("legend: one row per job and one per metric, many jobs summarised") {
  std::vector<JobCurves> jobs;
  for (int i = 0; i < 30; ++i) jobs.push_back(curves_from_events(i + 1, "job" + std::to_string(i), training_events(0, 1, 2), XAxis::epoch, {}));
  ChartOptions o;
  o.title = std::string(400, 'x');
  const std::string svg = render_svg(jobs, o);
  CHECK(svg.find("more jobs</text>") != std::string::npos);
  CHECK(svg.find(">#1 job0</text>") != std::string::npos);
  CHECK(svg.find(">test_loss</text>") != std::string::npos);
  CHECK(svg.find(std::string(400, 'x')) == std::string::npos);  // the title was shortened to fit
  CHECK(svg.find("…</text>") != std::string::npos);
}

TEST_CASE("decimation keeps each pixel column's first, extremes and last point, in order") {
  std::vector<Point> pts;
  for (int i = 0; i < 1000; ++i) pts.push_back({10 + i / 100.0, std::sin(i * 0.7)});  // 10 columns
  auto d = decimate(pts);
  CHECK(d.size() <= 40);
  CHECK(d.front().x == pts.front().x);
  CHECK(d.back().x == pts.back().x);
  for (std::size_t k = 1; k < d.size(); ++k) CHECK(d[k].x >= d[k - 1].x);
  double lo = 1, hi = -1;
  for (auto p : d) lo = std::min(lo, p.y), hi = std::max(hi, p.y);
  CHECK(lo < -0.99);  // the extremes survive
  CHECK(hi > 0.99);
  std::vector<Point> few{{0, 1}, {5, 2}, {9, 3}};
  CHECK(decimate(few).size() == 3);
}

TEST_CASE("svg: names XML forbids are replaced, so the file stays well-formed") {
  auto ev = training_events(0, 1, 2);
  for (auto& e : ev) e.data["bad\xEF\xBF\xBF\x01\xC0\xAF<loss>"] = 1.0;  // U+FFFF, a C0, an overlong form
  auto j = curves_from_events(3, "job \xEF\xBF\xBE", ev, XAxis::step, {});
  const std::string svg = render_svg({j}, ChartOptions{});
  CHECK(svg.find("\xEF\xBF\xBF") == std::string::npos);  // U+FFFF
  CHECK(svg.find("\xEF\xBF\xBE") == std::string::npos);  // U+FFFE
  CHECK(svg.find('\x01') == std::string::npos);
  CHECK(svg.find("\xC0\xAF") == std::string::npos);
  CHECK(svg.find("bad\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD&lt;loss&gt;") != std::string::npos);
  // Characters XML allows pass as they are: a euro sign, an emoji.
  auto ev2 = training_events(0, 1, 2);
  for (auto& e : ev2) e.data["\xE2\x82\xAC_loss_\xF0\x9F\x94\xA5"] = 1.0;
  const std::string svg2 = render_svg({curves_from_events(4, "b", ev2, XAxis::step, {})}, ChartOptions{});
  CHECK(svg2.find("\xE2\x82\xAC_loss_\xF0\x9F\x94\xA5") != std::string::npos);
}

TEST_CASE("curves: values beyond ±1e150 are left out and counted, the chart says so and has no NaN") {
  auto ev = training_events(0, 1, 4);
  ev.push_back({90, 0, "progress", 300, {{"step", 5}, {"loss", -1e308}}});
  ev.push_back({91, 0, "progress", 301, {{"step", 6}, {"loss", 1e308}}});
  ev.push_back({92, 0, "progress", 302, {{"step", 1e300}, {"loss", 0.1}}});
  auto j = curves_from_events(5, "a", ev, XAxis::step, {});
  CHECK(j.skipped == 3);
  const Curve* loss = find(j, "loss");
  REQUIRE(loss);
  for (auto p : loss->points) CHECK(std::abs(p.y) <= 1.0);
  const std::string svg = render_svg({j}, ChartOptions{});
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
  CHECK(svg.find("3 value(s) not drawn") != std::string::npos);
  // The count travels to the PNG painter; a document with such a value is refused there.
  auto back = parse_chart_document(json::parse(chart_document({j}, ChartOptions{}).dump()));
  REQUIRE(back);
  CHECK(back->first[0].skipped == 3);
  json doc = chart_document({j}, ChartOptions{});
  doc["jobs"][0]["curves"][0]["y"][0] = 1e308;
  auto refused = parse_chart_document(doc);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("beyond") != std::string::npos);
}

TEST_CASE("svg: no curves gives a chart that says so") {
  const std::string svg = render_svg({}, ChartOptions{});
  CHECK(svg.find("no progress events") != std::string::npos);
}

TEST_CASE("chart document: what gpuq hands the PNG painter comes back as the same chart") {
  const auto jobs = std::vector<JobCurves>{curves_from_events(7, "a \"quoted\" name", training_events(0, 2, 4),
                                                              XAxis::epoch, {}),
                                           curves_from_events(9, "b", training_events(0, 1, 3), XAxis::epoch, {})};
  ChartOptions o;
  o.title = "two jobs";
  o.x = XAxis::step;
  o.width = 900;
  o.log_y = true;
  auto back = parse_chart_document(json::parse(chart_document(jobs, o).dump()));
  REQUIRE(back);
  const auto& [jobs2, o2] = *back;
  REQUIRE(jobs2.size() == 2);
  CHECK(jobs2[0].name == "a \"quoted\" name");
  CHECK(jobs2[1].id == 9);
  REQUIRE(jobs2[0].curves.size() == jobs[0].curves.size());
  for (std::size_t c = 0; c < jobs[0].curves.size(); ++c) {
    CHECK(jobs2[0].curves[c].metric == jobs[0].curves[c].metric);
    REQUIRE(jobs2[0].curves[c].points.size() == jobs[0].curves[c].points.size());
    for (std::size_t i = 0; i < jobs[0].curves[c].points.size(); ++i) {
      CHECK(jobs2[0].curves[c].points[i].x == jobs[0].curves[c].points[i].x);
      CHECK(jobs2[0].curves[c].points[i].y == jobs[0].curves[c].points[i].y);
    }
  }
  CHECK(o2.title == "two jobs");
  CHECK(o2.x == XAxis::step);
  CHECK(o2.width == 900);
  CHECK(o2.log_y);
  CHECK(render_svg(jobs2, o2) == render_svg(jobs, o));
}

TEST_CASE("chart document: a wrong one is refused with what is wrong, never painted") {
  json good = chart_document({}, ChartOptions{});
  CHECK(parse_chart_document(good));
  auto refused = [&](auto change, const std::string& why) {
    json doc = good;
    change(doc);
    auto r = parse_chart_document(doc);
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.error().message.find(why) != std::string::npos, r.error().message);
  };
  refused([](json& d) { d.erase("width"); }, "width");
  refused([](json& d) { d["width"] = 50000; }, "out of range");
  refused([](json& d) { d["panel_height"] = 1; }, "out of range");
  refused([](json& d) { d["x"] = "sideways"; }, "unknown x axis");
  refused([](json& d) { d["jobs"] = {{{"id", 1}, {"name", "a"}, {"curves", {{{"metric", "loss"}, {"x", {1, 2}}, {"y", {1}}}}}}}; },
          "differ in length");
  refused([](json& d) { d["jobs"] = {{{"id", "one"}, {"name", "a"}, {"curves", json::array()}}}; }, "chart document");
}
