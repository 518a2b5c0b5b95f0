// PNG output of `gpuq plot`: the chart painted with cairo. Built when cairo is found; without
// it, render_png explains that and SVG still works.
#include "cli/plot.hpp"

#ifdef GPUQ_HAVE_CAIRO
#include <cairo.h>
#endif

namespace gpuq::cli::plot {

#ifdef GPUQ_HAVE_CAIRO

namespace {

class PngCanvas final : public Canvas {
 public:
  explicit PngCanvas(cairo_t* cr) : m_cr(cr) {}

  void rect(double x, double y, double w, double h, Rgb fill) override {
    cairo_set_source_rgb(m_cr, fill.r, fill.g, fill.b);
    cairo_rectangle(m_cr, x, y, w, h);
    cairo_fill(m_cr);
  }
  void frame(double x, double y, double w, double h, Rgb stroke) override {
    cairo_set_source_rgb(m_cr, stroke.r, stroke.g, stroke.b);
    cairo_set_line_width(m_cr, 1);
    cairo_set_dash(m_cr, nullptr, 0, 0);
    cairo_rectangle(m_cr, x + 0.5, y + 0.5, w, h);  // half-pixel offset: crisp 1 px lines
    cairo_stroke(m_cr);
  }
  void polyline(const std::vector<Point>& pts, Rgb color, double width, bool dashed, const std::string&, std::int64_t,
                const std::string&) override {
    if (pts.empty()) return;
    cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    cairo_set_line_width(m_cr, width);
    cairo_set_line_join(m_cr, CAIRO_LINE_JOIN_ROUND);
    const double dash[] = {6, 4};
    cairo_set_dash(m_cr, dashed ? dash : nullptr, dashed ? 2 : 0, 0);
    cairo_move_to(m_cr, pts[0].x, pts[0].y);
    for (std::size_t i = 1; i < pts.size(); ++i) cairo_line_to(m_cr, pts[i].x, pts[i].y);
    cairo_stroke(m_cr);
  }
  void dot(Point p, double radius, Rgb color) override {
    cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    cairo_new_sub_path(m_cr);
    cairo_arc(m_cr, p.x, p.y, radius, 0, 6.283185307179586);
    cairo_fill(m_cr);
  }
  void text(Point p, const std::string& s, double size, Anchor a, Rgb color, bool bold, bool vertical) override {
    font(size, bold);
    cairo_text_extents_t ext;
    cairo_text_extents(m_cr, s.c_str(), &ext);
    const double shift = a == Anchor::start ? 0 : a == Anchor::middle ? ext.x_advance / 2 : ext.x_advance;
    cairo_save(m_cr);
    cairo_translate(m_cr, p.x, p.y);
    if (vertical) cairo_rotate(m_cr, -1.5707963267948966);
    cairo_move_to(m_cr, -shift, 0);
    cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    cairo_show_text(m_cr, s.c_str());
    cairo_restore(m_cr);
  }
  double text_width(const std::string& s, double size) override {
    font(size, false);
    cairo_text_extents_t ext;
    cairo_text_extents(m_cr, s.c_str(), &ext);
    return ext.x_advance;
  }

 private:
  void font(double size, bool bold) {
    cairo_select_font_face(m_cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(m_cr, size);
  }
  cairo_t* m_cr;
};

}  // namespace

bool png_supported() { return true; }

Result<bool> render_png(const std::vector<JobCurves>& jobs, const ChartOptions& o, const std::string& path) {
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, o.width, chart_height(jobs, o));
  cairo_t* cr = cairo_create(surface);
  PngCanvas canvas(cr);
  draw_chart(canvas, jobs, o);
  cairo_destroy(cr);
  const cairo_status_t status = cairo_surface_write_to_png(surface, path.c_str());
  cairo_surface_destroy(surface);
  cairo_debug_reset_static_data();  // drop cairo's font caches: one chart per process
  if (status != CAIRO_STATUS_SUCCESS)
    return Error{ErrorCode::internal, "cannot write " + path + ": " + cairo_status_to_string(status)};
  return true;
}

#else

bool png_supported() { return false; }

Result<bool> render_png(const std::vector<JobCurves>&, const ChartOptions&, const std::string&) {
  return Error{ErrorCode::internal, "this gpuq was built without cairo, so it cannot write PNG; write .svg instead"};
}

#endif

}  // namespace gpuq::cli::plot
