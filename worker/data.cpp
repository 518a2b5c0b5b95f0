// Dataset loading (see data.hpp). zlib's gzread reads gzipped and plain files alike.
#include "worker/data.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
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
    int features = 1;
    for (std::size_t i = 1; i < images->dims.size(); ++i) features *= static_cast<int>(images->dims[i]);
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
  return d;
}

}  // namespace

Result<IdxArray> read_idx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return Error{ErrorCode::not_found, "dataset: cannot open " + path};
  std::vector<std::uint8_t> bytes;
  std::uint8_t buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof(buf))) > 0;) bytes.insert(bytes.end(), buf, buf + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string zerr = err < 0 && msg ? msg : "";
  gzclose(f);
  if (!zerr.empty()) return Error{ErrorCode::invalid_spec, "dataset: " + path + ": " + zerr};
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0)
    return Error{ErrorCode::invalid_spec, "dataset: " + path + " is not an IDX file (bad magic number)"};
  if (bytes[2] != 0x08)
    return Error{ErrorCode::invalid_spec, "dataset: " + path + " holds IDX type 0x" + std::to_string(bytes[2]) +
                                              "; only unsigned bytes (0x08) are supported"};
  IdxArray a;
  const int ndim = bytes[3];
  if (ndim < 1 || bytes.size() < 4u + 4u * ndim)
    return Error{ErrorCode::invalid_spec, "dataset: " + path + ": truncated IDX header"};
  std::uint64_t count = 1;
  for (int i = 0; i < ndim; ++i) {
    const std::uint8_t* p = &bytes[4 + 4 * i];
    a.dims.push_back(std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3]);
    count *= a.dims.back();
  }
  const std::size_t offset = 4 + 4 * ndim;
  if (bytes.size() - offset != count)
    return Error{ErrorCode::invalid_spec, "dataset: " + path + ": header says " + std::to_string(count) +
                                              " values, file has " + std::to_string(bytes.size() - offset)};
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
  return a;
}

Result<Dataset> load_csv(const common::DatasetSpec& spec, std::uint64_t seed) {
  auto read = [&](const std::string& path, Dataset& d, Split& s, bool first) -> Result<bool> {
    std::ifstream in(path);
    if (!in) return Error{ErrorCode::not_found, "dataset: cannot open " + path};
    std::string line;
    if (!std::getline(in, line)) return Error{ErrorCode::invalid_spec, "dataset: " + path + " is empty"};
    std::vector<std::string> header;
    std::stringstream hs(line);
    for (std::string col; std::getline(hs, col, ',');) header.push_back(col);
    auto label_at = std::find(header.begin(), header.end(), spec.label_column);
    if (label_at == header.end())
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " has no column \"" + spec.label_column +
                                                "\" (set train.dataset.label_column)"};
    const std::size_t label_col = static_cast<std::size_t>(label_at - header.begin());
    const int features = static_cast<int>(header.size()) - 1;
    if (first) d.features = features;
    else if (features != d.features)
      return Error{ErrorCode::invalid_spec, "dataset: " + path + " has " + std::to_string(features) +
                                                " feature columns, the training file " + std::to_string(d.features)};
    for (std::size_t lineno = 2; std::getline(in, line); ++lineno) {
      if (line.empty() || line == "\r") continue;
      std::stringstream ls(line);
      std::size_t col = 0;
      for (std::string cell; std::getline(ls, cell, ','); ++col) {
        char* end = nullptr;
        double v = std::strtod(cell.c_str(), &end);
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
