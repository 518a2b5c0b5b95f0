// Datasets for gpuq-worker, loaded without LibTorch (so loaders are unit-tested on their own):
// IDX files (MNIST, Fashion-MNIST; gzipped or not), CSV with a label column, and seeded synthetic
// classification (imbalanced if asked) or regression data. Features are float32, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/train_spec.hpp"

namespace gpuq::worker {

struct Split {
  std::int64_t n = 0;
  std::vector<float> x;              // n × features
  std::vector<std::int64_t> labels;  // classification: n class ids
  std::vector<float> targets;        // regression: n values
};

struct Dataset {
  int features = 0;
  std::vector<int> shape;  // per-sample shape: {C, H, W} for images, {features} otherwise
  int classes = 0;  // 0 for regression
  Split train, test;
  std::string description;  // for logs: "fashion-mnist: 60000 train, 10000 test, 784 features, 10 classes"
};

Result<Dataset> load_dataset(const common::DatasetSpec& spec, std::uint64_t seed);

// Pieces, exposed for tests.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
};
// Bounds on what a dataset file may ask for, checked before anything is read or allocated.
constexpr int k_max_idx_dims = 8;
constexpr std::uint64_t k_max_idx_values = 1ULL << 32;  // 4 GiB of bytes, 16 GiB as floats
constexpr int k_max_features = 1 << 24;
constexpr std::size_t k_max_csv_line = 16 << 20;  // bytes in one CSV line
// gzip or plain, unsigned-byte IDX, from a regular file: the header is read first, then exactly the
// values it promises (a gzip bomb is refused one byte past them), its sizes checked for overflow.
Result<IdxArray> read_idx(const std::string& path);
Result<Dataset> load_csv(const common::DatasetSpec& spec, std::uint64_t seed);
Dataset make_synthetic(const common::DatasetSpec& spec, std::uint64_t seed);
// Standardises features with the training split's per-feature mean and std (test uses the same).
void standardize(Dataset& d);

}  // namespace gpuq::worker
