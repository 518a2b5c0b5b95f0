// Dataset loading (see data.hpp). zlib's gzread reads gzipped and plain files alike.
#include "worker/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "worker/sampler.hpp"

namespace gpuq::worker {

namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

Result<std::string> find_idx(const std::string& dir, const std::string& stem) {
  for (const auto& name : {stem + ".gz", stem})
    if (exists(dir + "/" + name)) return dir + "/" + name;
  return Error{ErrorCode::not_found, "dataset: " + dir + " has no " + stem + "[.gz]" +
                                         (dir.find("fashion-mnist") != std::string::npos
                                              ? " (Debian: apt-get install dataset-fashion-mnist)"
                                              : "")};
}

// Takes a subset of rows (in the given order) of a split.
Split take(const Split& s, int features, const std::vector<std::int64_t>& rows) {
  Split out;
  out.n = static_cast<std::int64_t>(rows.size());
  out.x.reserve(rows.size() * features);
  for (auto r : rows) {
    out.x.insert(out.x.end(), s.x.begin() + r * features, s.x.begin() + (r + 1) * features);
    if (!s.labels.empty()) out.labels.push_back(s.labels[r]);
    if (!s.targets.empty()) out.targets.push_back(s.targets[r]);
  }
  return out;
}

// Splits `all` into train and test with a seeded shuffle.
void split_off_test(Dataset& d, Split all, double test_fraction, std::uint64_t seed) {
  auto order = permutation(all.n, seed ^ 0x7e57);
  auto n_test = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(all.n * test_fraction)));
  std::vector<std::int64_t> test(order.begin(), order.begin() + n_test), train(order.begin() + n_test, order.end());
  d.test = take(all, d.features, test);
  d.train = take(all, d.features, train);
}

void apply_limit(Dataset& d, std::int64_t limit) {
  if (limit <= 0 || limit >= d.train.n) return;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(limit));
  std::iota(rows.begin(), rows.end(), 0);
  d.train = take(d.train, d.features, rows);
}

Result<Dataset> load_idx_dir(const common::DatasetSpec& spec) {
  Dataset d;
  Split* parts[2] = {&d.train, &d.test};
  const char* prefixes[2] = {"train", "t10k"};
  for (int p = 0; p < 2; ++p) {
    auto images_path = find_idx(spec.path, std::string(prefixes[p]) + "-images-idx3-ubyte");
    if (!images_path) return images_path.error();
    auto labels_path = find_idx(spec.path, std::string(prefixes[p]) + "-labels-idx1-ubyte");
    if (!labels_path) return labels_path.error();
    auto images = read_idx(*images_path);
    if (!images) return images.error();
    auto labels = read_idx(*labels_path);
    if (!labels) return labels.error();
    if (images->dims.size() < 2 || labels->dims.size() != 1 || images->dims[0] != labels->dims[0])
      return Error{ErrorCode::invalid_spec, "dataset: " + *images_path + " and " + *labels_path +
                                                " do not match (images need N×H×W…, labels N, same N)"};
    if (images->dims[0] == 0)
      return Error{ErrorCode::invalid_spec, "dataset: " + *images_path + " holds no samples"};
    std::uint64_t feature_count = 1;
    for (std::size_t i = 1; i < images->dims.size(); ++i) feature_count *= images->dims[i];  // within k_max_idx_values
    if (feature_count == 0 || feature_count > static_cast<std::uint64_t>(k_max_features))
      return Error{ErrorCode::invalid_spec, "dataset: " + *images_path + " has " + std::to_string(feature_count) +
                                                " features a sample; 1 to " + std::to_string(k_max_features) + " are supported"};
    const int features = static_cast<int>(feature_count);
    if (images->dims.size() == 3) d.shape = {1, static_cast<int>(images->dims[1]), static_cast<int>(images->dims[2])};
    if (p == 1 && features != d.features)
      return Error{ErrorCode::invalid_spec, "dataset: test images have " + std::to_string(features) +
                                                " features, training images " + std::to_string(d.features)};
    d.features = features;
    Split& s = *parts[p];
    s.n = images->dims[0];
    s.x.resize(images->data.size());
    for (std::size_t i = 0; i < images->data.size(); ++i) s.x[i] = images->data[i] / 255.0f;
    s.labels.assign(labels->data.begin(), labels->data.end());
  }
  d.classes = 1 + static_cast<int>(*std::max_element(d.train.labels.begin(), d.train.labels.end()));
  // Told now, not after a whole epoch, when the first evaluation meets a class the model lacks.
  if (const auto top = std::max_element(d.test.labels.begin(), d.test.labels.end());
      top != d.test.labels.end() && *top >= d.classes)
    return Error{ErrorCode::invalid_spec, "dataset: " + spec.path + ": a test label is " + std::to_string(*top) +
                                              ", and the training labels are 0 to " + std::to_string(d.classes - 1)};
  return d;
}

}  // namespace

Result<IdxArray> read_idx(const std::string& path) {
  // A regular file only: /dev/zero or a fifo named as a dataset would be read without end.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error{ErrorCode::not_found, "dataset: cannot open " + path + ": " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{ErrorCode::invalid_spec, "dataset: " + path + " is not a regular file"};
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    return Error{ErrorCode::internal, "dataset: cannot read " + path};
  }
  // Reads up to `n` bytes; how many it got, or -1 with `zerr` set.
  std::string zerr;
  const auto read = [&](std::uint8_t* into, std::uint64_t n) -> std::int64_t {
    std::uint64_t got = 0;
    while (got < n) {
      const int r = gzread(f, into + got, static_cast<unsigned>(std::min<std::uint64_t>(n - got, 1u << 30)));
      if (r < 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        zerr = msg ? msg : "read error";
        return -1;
      }
      if (r == 0) break;
      got += static_cast<std::uint64_t>(r);
    }
    return static_cast<std::int64_t>(got);
  };
  const auto fail = [&](const std::string& what) -> Result<IdxArray> {
    gzclose(f);
    return Error{ErrorCode::invalid_spec, "dataset: " + path + (what.empty() ? ": " + zerr : what)};
  };
  // The header first, and then only as much as it promises: a small gzip that inflates to
  // gigabytes (a bomb) is refused having read one byte past what the header allows.
  std::uint8_t magic[4];
  const std::int64_t got_magic = read(magic, 4);
  if (got_magic < 0) return fail("");
  if (got_magic < 4 || magic[0] != 0 || magic[1] != 0) return fail(" is not an IDX file (bad magic number)");
  if (magic[2] != 0x08)
    return fail(" holds IDX type 0x" + std::to_string(magic[2]) + "; only unsigned bytes (0x08) are supported");
  const int ndim = magic[3];
  if (ndim < 1 || ndim > k_max_idx_dims)
    return fail(" has " + std::to_string(ndim) + " dimensions; an IDX dataset has 1 to " + std::to_string(k_max_idx_dims));
  std::uint8_t dims[4 * k_max_idx_dims];
  const std::int64_t got_dims = read(dims, 4u * static_cast<unsigned>(ndim));
  if (got_dims < 0) return fail("");
  if (got_dims < 4 * ndim) return fail(": truncated IDX header");
  IdxArray a;
  std::uint64_t count = 1;
  for (int i = 0; i < ndim; ++i) {
    const std::uint8_t* p = &dims[4 * i];
    a.dims.push_back(std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3]);
    // Checked: the product of four 32-bit sizes wraps a 64-bit count.
    if (a.dims.back() != 0 && count > k_max_idx_values / a.dims.back())
      return fail(": its header's sizes come to more than " + std::to_string(k_max_idx_values) + " values");
    count *= a.dims.back();
  }
  // Memory follows the bytes that are there, not the header's word: 8 bytes claiming 2^32 values
  // must not take 4 GiB. resize grows the capacity geometrically, so this copies little.
  constexpr std::uint64_t k_step = 64 << 20;
  std::uint64_t got = 0;
  while (got < count) {
    const std::uint64_t want = std::min(count - got, k_step);
    a.data.resize(got + want);
    const std::int64_t n = read(a.data.data() + got, want);
    if (n < 0) return fail("");
    got += static_cast<std::uint64_t>(n);
    if (static_cast<std::uint64_t>(n) < want) break;
  }
  if (got != count)
    return fail(": header says " + std::to_string(count) + " values, file has " + std::to_string(got));
  std::uint8_t extra;
  const std::int64_t more = read(&extra, 1);
  if (more < 0) return fail("");
  if (more > 0) return fail(": header says " + std::to_string(count) + " values, file has more");
  gzclose(f);
  return a;
}

namespace {

// One line of `in` into `line` (its '\r' before the '\n' dropped), at most `max` bytes: false at
// the end of the file; `too_long` when a line passes `max` (memory would follow its length).
bool bounded_line(std::istream& in, std::string& line, std::size_t max, bool& too_long) {
  line.clear();
  too_long = false;
  for (int c; (c = in.get()) != EOF;) {
    if (c == '\n') break;
    if (line.size() == max) {
      too_long = true;
      return true;
    }
    line.push_back(static_cast<char>(c));
  }
  if (line.empty() && in.eof()) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace

Result<Dataset> load_csv(const common::DatasetSpec& spec, std::uint64_t seed) {
  auto read = [&](const std::string& path, Dataset& d, Split& s, bool first) -> Result<bool> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Error{ErrorCode::not_found, "dataset: cannot open " + path};
    if (!S_ISREG(st.st_mode))  // /dev/zero, a fifo: read without end
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " is not a regular file"};
    std::ifstream in(path, std::ios::binary);
    if (!in) return Error{ErrorCode::not_found, "dataset: cannot open " + path};
    std::string line;
    bool too_long = false;
    const auto line_too_long = [&](std::size_t lineno) {
      return Error{ErrorCode::invalid_spec, "dataset: " + path + ":" + std::to_string(lineno) + " is longer than " +
                                                std::to_string(k_max_csv_line >> 20) + " MiB"};
    };
    if (!bounded_line(in, line, k_max_csv_line, too_long))
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " is empty"};
    if (too_long) return line_too_long(1);
    std::vector<std::string> header;
    std::stringstream hs(line);
    for (std::string col; std::getline(hs, col, ',');) header.push_back(col);
    auto label_at = std::find(header.begin(), header.end(), spec.label_column);
    if (label_at == header.end())
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " has no column \"" + spec.label_column +
                                                "\" (set train.dataset.label_column)"};
    const std::size_t label_col = static_cast<std::size_t>(label_at - header.begin());
    const int features = static_cast<int>(header.size()) - 1;
    if (features < 1)
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " has no feature columns, only \"" +
                                                spec.label_column + "\""};
    if (first) d.features = features;
    else if (features != d.features)
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " has " + std::to_string(features) +
                                                " feature columns, the training file " + std::to_string(d.features)};
    for (std::size_t lineno = 2; bounded_line(in, line, k_max_csv_line, too_long); ++lineno) {
      if (too_long) return line_too_long(lineno);
      if (line.empty()) continue;
      std::stringstream ls(line);
      std::size_t col = 0;
      for (std::string cell; std::getline(ls, cell, ','); ++col) {
        char* end = nullptr;
        double v = std::strtod(cell.c_str(), &end);
        // Finite as a float too: 1e39 is a double, but inf in training (a NaN loss, "succeeded").
        if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max() && end && (*end == '\0' || *end == '\r'))
          return Error{ErrorCode::invalid_spec, "dataset: " + path + ":" + std::to_string(lineno) + ": column \"" +
                                                    (col < header.size() ? header[col] : "?") + "\" holds " +
                                                    cell.substr(0, 32) + ", past a float's range (3.4e38)"};
        if (cell.empty() || (end && *end != '\0' && *end != '\r') || !std::isfinite(v))
          return Error{ErrorCode::invalid_spec, "dataset: " + path + ":" + std::to_string(lineno) + ": column \"" +
                                                    (col < header.size() ? header[col] : "?") + "\" is not a number: \"" +
                                                    cell.substr(0, 32) + "\""};
        if (col == label_col) {
          if (v < 0 || v != std::floor(v) || v > 1e6)
            return Error{ErrorCode::invalid_spec, "dataset: " + path + ":" + std::to_string(lineno) +
                                                      ": labels must be class ids 0, 1, 2, …, got " + cell};
          s.labels.push_back(static_cast<std::int64_t>(v));
        } else {
          s.x.push_back(static_cast<float>(v));
        }
      }
      if (col != header.size())
        return Error{ErrorCode::invalid_spec, "dataset: " + path + ":" + std::to_string(lineno) + ": " +
                                                  std::to_string(col) + " columns, the header has " +
                                                  std::to_string(header.size())};
      s.n++;
    }
    if (s.n == 0) return Error{ErrorCode::invalid_spec, "dataset: " + path + " has a header but no rows"};
    return true;
  };
  Dataset d;
  Split all;
  if (auto r = read(spec.path, d, all, true); !r) return r.error();
  if (spec.test_path.empty()) {
    if (all.n < 2)  // the test split takes at least one row: none would be left to train on
      return Error{ErrorCode::invalid_spec, "dataset: " + spec.path + " has " + std::to_string(all.n) +
                                                " row; a test split needs at least 2 (or give test_path)"};
    split_off_test(d, std::move(all), spec.test_fraction, seed);
  } else {
    d.train = std::move(all);
    if (auto r = read(spec.test_path, d, d.test, false); !r) return r.error();
  }
  std::int64_t max_label = 0;
  for (auto l : d.train.labels) max_label = std::max(max_label, l);
  for (auto l : d.test.labels) max_label = std::max(max_label, l);
  d.classes = static_cast<int>(max_label + 1);
  return d;
}

Dataset make_synthetic(const common::DatasetSpec& spec, std::uint64_t seed) {
  Dataset d;
  d.features = spec.features;
  const bool regression = spec.task == "regression";
  d.classes = regression ? 0 : spec.classes;
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Split all;
  all.n = spec.samples;
  all.x.resize(static_cast<std::size_t>(all.n) * d.features);
  if (regression) {
    std::vector<float> w(d.features);
    for (auto& v : w) v = normal(rng);
    for (std::int64_t i = 0; i < all.n; ++i) {
      float y = 0;
      for (int f = 0; f < d.features; ++f) {
        float v = normal(rng);
        all.x[i * d.features + f] = v;
        y += w[f] * v;
      }
      all.targets.push_back(y + 0.1f * normal(rng));
    }
  } else {
    // Gaussian blobs, one centre per class; class proportions follow class_weights.
    std::vector<float> centres(static_cast<std::size_t>(d.classes) * d.features);
    for (auto& v : centres) v = 1.5f * normal(rng);
    std::vector<double> weights = spec.class_weights.empty() ? std::vector<double>(d.classes, 1.0) : spec.class_weights;
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    for (std::int64_t i = 0; i < all.n; ++i) {
      int c = pick(rng);
      all.labels.push_back(c);
      for (int f = 0; f < d.features; ++f) all.x[i * d.features + f] = centres[c * d.features + f] + normal(rng);
    }
  }
  split_off_test(d, std::move(all), spec.test_fraction, seed);
  return d;
}

void standardize(Dataset& d) {
  const int f = d.features;
  if (d.train.n == 0 || f == 0) return;
  std::vector<double> mean(f, 0), var(f, 0);
  for (std::int64_t i = 0; i < d.train.n; ++i)
    for (int j = 0; j < f; ++j) mean[j] += d.train.x[i * f + j];
  for (auto& m : mean) m /= static_cast<double>(d.train.n);
  for (std::int64_t i = 0; i < d.train.n; ++i)
    for (int j = 0; j < f; ++j) {
      double c = d.train.x[i * f + j] - mean[j];
      var[j] += c * c;
    }
  for (Split* s : {&d.train, &d.test})
    for (std::int64_t i = 0; i < s->n; ++i)
      for (int j = 0; j < f; ++j) {
        double sd = std::sqrt(var[j] / static_cast<double>(d.train.n));
        s->x[i * f + j] = static_cast<float>((s->x[i * f + j] - mean[j]) / (sd > 1e-8 ? sd : 1.0));
      }
}

Result<Dataset> load_dataset(const common::DatasetSpec& spec, std::uint64_t seed) {
  Result<Dataset> d = Error{ErrorCode::internal, "unknown dataset kind " + spec.kind};
  if (spec.kind == "synthetic") d = make_synthetic(spec, seed);
  else if (spec.kind == "csv") d = load_csv(spec, seed);
  else d = load_idx_dir(spec);  // fashion-mnist, mnist, idx
  if (!d) return d;
  if (d->shape.empty()) d->shape = {d->features};
  if (spec.kind != "synthetic") standardize(*d);  // synthetic data is already unit-scale
  apply_limit(*d, spec.limit);
  d->description = spec.kind + ": " + std::to_string(d->train.n) + " train, " + std::to_string(d->test.n) + " test, " +
                   std::to_string(d->features) + " features, " +
                   (d->classes ? std::to_string(d->classes) + " classes" : std::string("regression"));
  return d;
}

}  // namespace gpuq::worker
