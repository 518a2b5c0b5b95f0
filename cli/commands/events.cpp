// `gpuq plot ID... -o FILE.png|.svg` draws the jobs' progress events as curves; `gpuq events ID`
// prints them.
#include <algorithm>
#include <fstream>
#include <iostream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/plot.hpp"
#include "cli/rpc.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

struct PlotArgs : Selection {
  std::string output;  // .png or .svg
  std::string x = "auto";
  std::vector<std::string> metrics;  // empty: the loss and accuracy fields
  int attempt = 0;                   // 0: each job's latest
  std::string title;
  int width = 1100;
  bool log_y = false;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Every event of one attempt (of `type`, if not empty), page by page; the attempt they belong to.
Result<std::vector<common::Event>> fetch_events(common::Client& client, std::int64_t id, int attempt,
                                                const std::string& type, int* attempt_out = nullptr) {
  std::vector<common::Event> out;
  for (std::int64_t after = 0;;) {
    auto page = client.call(common::cmd::events, common::EventsRequest{id, attempt, type, after});
    if (!page) return page.error();
    if (attempt_out) *attempt_out = page->attempt;
    for (auto& e : page->events)
      out.push_back(std::move(e));
    if (!page->more || page->events.empty()) return out;
    after = out.back().seq;
  }
}


int cmd_plot(const Options& o, const PlotArgs& a) {
  const std::string ext = lower(a.output);
  const bool png = ends_with(ext, ".png");
  if (!png && !ends_with(ext, ".svg")) {
    std::cerr << "gpuq: the plot's file name must end in .png or .svg, got " << a.output << "\n";
    return k_exit_usage;
  }
  std::string painter;
  if (png) {
    auto found = plot::png_painter();
    if (!found) {
      std::cerr << "gpuq: " << found.error().message << "\n";
      return k_exit_usage;
    }
    painter = *found;
  }
  auto wanted = plot::parse_x_axis(a.x);
  if (!wanted) {
    std::cerr << "gpuq: --x must be auto, epoch, step or time, got " << a.x << "\n";
    return k_exit_usage;
  }

  // Names and events of every job
  auto client = common::Client::connect(o.socket);
  if (!client) return report(client.error());
  common::ResultsRequest req;
  req.ids = a.ids;
  auto info = all_results(*client, req);
  if (!info) return report(info.error());
  const auto jobs = std::move(info->jobs);
  std::vector<std::vector<common::Event>> events;
  std::vector<std::size_t> plotted;  // indexes into jobs of those with progress events
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    auto ev = fetch_events(*client, jobs[i].id, a.attempt, "progress");
    if (!ev) return report(ev.error());
    if (ev->empty()) {
      std::cerr << "gpuq: job " << jobs[i].id << " (" << jobs[i].name << ") has no progress events"
                << (jobs[i].state == JobState::queued ? " yet (it has not run)" : "") << "; left out\n";
      continue;
    }
    events.push_back(std::move(*ev));
    plotted.push_back(i);
  }
  if (plotted.empty()) {
    std::cerr << "gpuq: nothing to plot: no job has progress events (docs/job-spec.md, \"Events\")\n";
    return k_exit_refused;
  }
  auto x = plot::common_x_axis(events, *wanted);
  if (!x) {
    std::cerr << "gpuq: not every job's progress events have " << (*wanted == plot::XAxis::automatic ? "a step or epoch" : a.x)
              << "; try --x time\n";
    return k_exit_refused;
  }

  // Curves, chart, file
  std::vector<plot::JobCurves> curves;
  std::size_t n_curves = 0;
  for (std::size_t k = 0; k < plotted.size(); ++k) {
    const auto& j = jobs[plotted[k]];
    curves.push_back(plot::curves_from_events(j.id, j.name, events[k], *x, a.metrics));
    n_curves += curves.back().curves.size();
  }
  if (n_curves == 0) {
    std::cerr << "gpuq: the jobs' progress events have no "
              << (a.metrics.empty() ? "loss or accuracy fields; name the fields to plot with --metric" : "such fields")
              << "\n";
    return k_exit_refused;
  }
  plot::ChartOptions chart;
  chart.x = *x;
  chart.width = a.width;
  chart.log_y = a.log_y;
  chart.title = a.title;
  if (chart.title.empty()) {
    for (std::size_t k = 0; k < plotted.size(); ++k)
      chart.title += (k ? ", " : "") + jobs[plotted[k]].name + " (#" + std::to_string(jobs[plotted[k]].id) + ")";
  }
  if (png) {
    if (auto w = plot::render_png(painter, curves, chart, a.output); !w) {
      std::cerr << "gpuq: " << w.error().message << "\n";
      return k_exit_refused;
    }
  } else {
    std::ofstream out(a.output, std::ios::binary | std::ios::trunc);
    out << plot::render_svg(curves, chart);
    out.close();
    if (!out) {
      std::cerr << "gpuq: cannot write " << a.output << "\n";
      return k_exit_refused;
    }
  }
  int skipped = 0;
  for (const auto& c : curves) skipped += c.skipped;
  if (o.json) {
    json series = json::array();
    for (const auto& c : curves)
      for (const auto& cv : c.curves) series.push_back({{"id", c.id}, {"metric", cv.metric}, {"points", cv.points.size()}});
    print_json({{"file", a.output}, {"x", plot::x_axis_name(*x)}, {"series", series}, {"skipped", skipped}});
  } else {
    std::cout << "wrote " << printable(a.output) << ": " << n_curves << " curve(s) of " << plotted.size()
              << " job(s) against " << plot::x_axis_name(*x);
    if (skipped > 0) std::cout << "; " << skipped << " value(s) not drawn (not finite, or beyond ±1e150)";
    std::cout << "\n";
  }
  return k_exit_ok;
}

int cmd_events(const Options& o, std::int64_t id, int attempt, const std::string& type) {
  if (!type.empty() && type != "progress" && type != "result") {
    std::cerr << "gpuq: --type must be progress or result, got " << type << "\n";
    return k_exit_usage;
  }
  auto client = common::Client::connect(o.socket);
  if (!client) return report(client.error());
  int shown_attempt = 0;
  auto events = fetch_events(*client, id, attempt, type, &shown_attempt);
  if (!events) return report(events.error());
  if (o.json) {
    std::cout << "{\n  \"id\": " << id << ",\n  \"attempt\": " << shown_attempt << ",\n  \"events\": [";
    for (std::size_t i = 0; i < events->size(); ++i) std::cout << (i ? ",\n    " : "\n    ") << json((*events)[i]).dump();
    std::cout << (events->empty() ? "]\n}\n" : "\n  ]\n}\n");
    return k_exit_ok;
  }
  if (events->empty()) {
    std::cout << "job " << id << " has no " << (type.empty() ? "" : type + " ") << "events"
              << (shown_attempt ? " in attempt " + std::to_string(shown_attempt) : "") << "\n";
    return k_exit_ok;
  }
  Table t({"SEQ", "TIME", "RANK", "TYPE", "FIELDS"});
  for (const auto& e : *events) {
    std::string fields;
    for (const auto& [k, v] : e.data.items())
      if (k != "type") fields += (fields.empty() ? "" : " ") + k + "=" + format_value(v);
    t.add({std::to_string(e.seq), format_time(e.at).substr(11), std::to_string(e.rank), e.type, fields});
  }
  t.print(std::cout);
  return k_exit_ok;
}

}  // namespace

void add_plot(CLI::App& app, Context& ctx) {
  auto a = args<PlotArgs>();
  auto* sub = app.add_subcommand("plot", "Draw jobs' training curves (loss, accuracy) into one PNG or SVG chart");
  add_selection(sub, *a, "Job ids");
  sub->add_option("--output,-o", a->output, "The picture: FILE.png or FILE.svg")->required();
  sub->add_option("--x", a->x, "x axis: auto (epoch, else step, else time), epoch, step or time")->capture_default_str();
  sub->add_option("--metric,-m", a->metrics, "A progress field to plot (repeatable; default: the loss and accuracy fields)");
  sub->add_option("--attempt", a->attempt, "Plot this attempt (default: each job's latest)");
  sub->add_option("--title", a->title, "Chart title (default: the jobs' names)");
  sub->add_flag("--log-y", a->log_y, "Log scale for every panel of positive values (losses spanning 3 decades get one anyway)");
  sub->add_option("--width", a->width, "Picture width in pixels")->check(CLI::Range(400, 8000))->capture_default_str();
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      int code = add_batch_ids(ctx.opt, a->batch, a->ids);
      return code ? code : cmd_plot(ctx.opt, *a);
    };
  });
}

void add_events(CLI::App& app, Context& ctx) {
  struct Args {
    std::int64_t id = 0;
    int attempt = 0;
    std::string type;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("events", "A job's progress and result events, as it reported them");
  sub->add_option("id", a->id, "Job id")->required();
  sub->add_option("--attempt", a->attempt, "This attempt (default: the latest)");
  sub->add_option("--type", a->type, "Only progress or only result events");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] { ctx.run = [&ctx, a] { return cmd_events(ctx.opt, a->id, a->attempt, a->type); }; });
}

}  // namespace gpuq::cli
