// Samplers (see sampler.hpp).
#include "worker/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

namespace gpuq::worker {

namespace {
// splitmix64: a fast, well-mixed seed expansion; std::mt19937_64 output is fixed by the standard.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 rng(mix(seed));
  // Fisher–Yates with our own bounded draw: std::uniform_int_distribution differs across libraries.
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::int64_t j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

std::vector<std::int64_t> shard_indices(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch,
                                        bool shuffle) {
  std::vector<std::int64_t> order;
  if (shuffle) {
    order = permutation(n, seed + static_cast<std::uint64_t>(epoch));
  } else {
    order.resize(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
  }
  const std::int64_t per_rank = (n + world - 1) / world;
  const std::int64_t total = per_rank * world;
  for (std::int64_t i = n; i < total; ++i) order.push_back(order[static_cast<std::size_t>((i - n) % n)]);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank));
  for (std::int64_t i = rank; i < total; i += world) mine.push_back(order[static_cast<std::size_t>(i)]);
  return mine;
}

std::vector<std::int64_t> weighted_indices(const std::vector<double>& weights, std::int64_t count, int rank, int world,
                                           std::uint64_t seed, std::int64_t epoch) {
  std::vector<double> cumulative(weights.size());
  std::partial_sum(weights.begin(), weights.end(), cumulative.begin());
  const double total = cumulative.empty() ? 0 : cumulative.back();
  std::mt19937_64 rng(mix(seed + static_cast<std::uint64_t>(epoch)));
  const std::int64_t per_rank = (count + world - 1) / world;
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank));
  for (std::int64_t i = 0; i < per_rank * world; ++i) {
    // 53 random bits -> [0, total)
    double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * total;
    auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
    if (it == cumulative.end()) --it;
    if (i % world == rank) mine.push_back(it - cumulative.begin());
  }
  return mine;
}

std::vector<double> inverse_class_frequency(const std::vector<std::int64_t>& labels, int classes) {
  std::vector<double> count(static_cast<std::size_t>(classes), 0);
  for (auto l : labels) count[static_cast<std::size_t>(l)] += 1;
  std::vector<double> w;
  w.reserve(labels.size());
  for (auto l : labels) w.push_back(1.0 / count[static_cast<std::size_t>(l)]);
  return w;
}

}  // namespace gpuq::worker
