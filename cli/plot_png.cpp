// PNG output of `gpuq plot`: the chart painted with cairo, in gpuq-plot-png (plot_png_main.cpp),
// which gpuq runs for it (png_client.cpp). Built when cairo's headers are found. libcairo is
// loaded (dlopen) when the painter starts rather than linked, so that a system without it still
// installs gpuq (cairo is a Recommends) and is told what is missing.
#include "cli/plot.hpp"

#ifdef GPUQ_HAVE_CAIRO
#include <cairo.h>
#include <dlfcn.h>
#endif

namespace gpuq::cli::plot {

#ifdef GPUQ_HAVE_CAIRO

namespace {

#define GPUQ_CAIRO_FUNCTIONS(X)                                                                              \
  X(cairo_set_source_rgb) X(cairo_rectangle) X(cairo_fill) X(cairo_set_line_width) X(cairo_set_dash)         \
  X(cairo_stroke) X(cairo_set_line_join) X(cairo_move_to) X(cairo_line_to) X(cairo_new_sub_path) X(cairo_arc) \
  X(cairo_text_extents) X(cairo_save) X(cairo_translate) X(cairo_rotate) X(cairo_show_text) X(cairo_restore) \
  X(cairo_select_font_face) X(cairo_set_font_size) X(cairo_image_surface_create) X(cairo_create)            \
  X(cairo_destroy) X(cairo_surface_write_to_png) X(cairo_surface_destroy) X(cairo_debug_reset_static_data)  \
  X(cairo_status_to_string)

// The cairo functions used here, by the names and types of cairo.h, from libcairo.so.2.
struct Cairo {
#define GPUQ_CAIRO_POINTER(f) decltype(&::f) f = nullptr;
  GPUQ_CAIRO_FUNCTIONS(GPUQ_CAIRO_POINTER)
#undef GPUQ_CAIRO_POINTER
};

// Loads libcairo once; an error names what is missing.
Result<const Cairo*> load_cairo() {
  static Cairo cairo;
  static std::string error = [] {
    void* lib = ::dlopen("libcairo.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return std::string("cannot load libcairo.so.2 (") + ::dlerror() + "); install libcairo2, or write .svg instead";
    std::string missing;
#define GPUQ_CAIRO_LOAD(f)                                                     \
  cairo.f = reinterpret_cast<decltype(cairo.f)>(::dlsym(lib, #f)); \
  if (!cairo.f) missing += std::string(missing.empty() ? "" : ", ") + #f;
    GPUQ_CAIRO_FUNCTIONS(GPUQ_CAIRO_LOAD)
#undef GPUQ_CAIRO_LOAD
    return missing.empty() ? missing : "libcairo.so.2 lacks " + missing + "; write .svg instead";
  }();
  if (!error.empty()) return Error{ErrorCode::internal, error};
  return &cairo;
}

class PngCanvas final : public Canvas {
 public:
  PngCanvas(const Cairo& c, cairo_t* cr) : m_c(c), m_cr(cr) {}

  void rect(double x, double y, double w, double h, Rgb fill) override {
    m_c.cairo_set_source_rgb(m_cr, fill.r, fill.g, fill.b);
    m_c.cairo_rectangle(m_cr, x, y, w, h);
    m_c.cairo_fill(m_cr);
  }
  void frame(double x, double y, double w, double h, Rgb stroke) override {
    m_c.cairo_set_source_rgb(m_cr, stroke.r, stroke.g, stroke.b);
    m_c.cairo_set_line_width(m_cr, 1);
    m_c.cairo_set_dash(m_cr, nullptr, 0, 0);
    m_c.cairo_rectangle(m_cr, x + 0.5, y + 0.5, w, h);  // half-pixel offset: crisp 1 px lines
    m_c.cairo_stroke(m_cr);
  }
  void polyline(const std::vector<Point>& pts, Rgb color, double width, bool dashed, const std::string&, std::int64_t,
                const std::string&) override {
    if (pts.empty()) return;
    m_c.cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    m_c.cairo_set_line_width(m_cr, width);
    m_c.cairo_set_line_join(m_cr, CAIRO_LINE_JOIN_ROUND);
    const double dash[] = {6, 4};
    m_c.cairo_set_dash(m_cr, dashed ? dash : nullptr, dashed ? 2 : 0, 0);
    m_c.cairo_move_to(m_cr, pts[0].x, pts[0].y);
    for (std::size_t i = 1; i < pts.size(); ++i) m_c.cairo_line_to(m_cr, pts[i].x, pts[i].y);
    m_c.cairo_stroke(m_cr);
  }
  void dot(Point p, double radius, Rgb color) override {
    m_c.cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    m_c.cairo_new_sub_path(m_cr);
    m_c.cairo_arc(m_cr, p.x, p.y, radius, 0, 6.283185307179586);
    m_c.cairo_fill(m_cr);
  }
  void text(Point p, const std::string& s, double size, Anchor a, Rgb color, bool bold, bool vertical) override {
    font(size, bold);
    cairo_text_extents_t ext;
    m_c.cairo_text_extents(m_cr, s.c_str(), &ext);
    const double shift = a == Anchor::start ? 0 : a == Anchor::middle ? ext.x_advance / 2 : ext.x_advance;
    m_c.cairo_save(m_cr);
    m_c.cairo_translate(m_cr, p.x, p.y);
    if (vertical) m_c.cairo_rotate(m_cr, -1.5707963267948966);
    m_c.cairo_move_to(m_cr, -shift, 0);
    m_c.cairo_set_source_rgb(m_cr, color.r, color.g, color.b);
    m_c.cairo_show_text(m_cr, s.c_str());
    m_c.cairo_restore(m_cr);
  }
  double text_width(const std::string& s, double size) override {
    font(size, false);
    cairo_text_extents_t ext;
    m_c.cairo_text_extents(m_cr, s.c_str(), &ext);
    return ext.x_advance;
  }

 private:
  void font(double size, bool bold) {
    m_c.cairo_select_font_face(m_cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    m_c.cairo_set_font_size(m_cr, size);
  }
  const Cairo& m_c;
  cairo_t* m_cr;
};

}  // namespace

Result<bool> paint_png(const std::vector<JobCurves>& jobs, const ChartOptions& o, const std::string& path) {
  auto loaded = load_cairo();
  if (!loaded) return loaded.error();
  const Cairo& c = **loaded;
  cairo_surface_t* surface = c.cairo_image_surface_create(CAIRO_FORMAT_RGB24, o.width, chart_height(jobs, o));
  cairo_t* cr = c.cairo_create(surface);
  PngCanvas canvas(c, cr);
  draw_chart(canvas, jobs, o);
  c.cairo_destroy(cr);
  const cairo_status_t status = c.cairo_surface_write_to_png(surface, path.c_str());
  c.cairo_surface_destroy(surface);
  c.cairo_debug_reset_static_data();  // drop cairo's font caches: one chart per process
  if (status != CAIRO_STATUS_SUCCESS)
    return Error{ErrorCode::internal, "cannot write " + path + ": " + c.cairo_status_to_string(status)};
  return true;
}

#else

Result<bool> paint_png(const std::vector<JobCurves>&, const ChartOptions&, const std::string&) {
  return Error{ErrorCode::internal, "this gpuq was built without cairo, so it cannot write PNG; write .svg instead"};
}

#endif

}  // namespace gpuq::cli::plot
