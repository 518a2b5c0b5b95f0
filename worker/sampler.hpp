// Which samples each rank trains on, in which order. No LibTorch: pure index arithmetic, so the
// properties DDP correctness rests on are unit-tested directly.
//
// shard_indices follows torch.utils.data.DistributedSampler (drop_last=False): one permutation of
// all n indices per epoch (seeded with seed + epoch, identical on every rank), padded by wrapping
// around to a multiple of `world`, and rank r takes positions r, r + world, r + 2·world, …
// Shards are therefore equal-sized and disjoint up to the padding, and together cover the data.
// With world = 1 and batch B·world, a single process sees exactly the union of the ranks' batches
// of size B, which is what makes DDP equal to single-process training on the global batch.
#pragma once

#include <cstdint>
#include <vector>

namespace gpuq::worker {

// A seeded Fisher–Yates permutation of 0..n-1 (same result on every platform).
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed);

std::vector<std::int64_t> shard_indices(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch,
                                        bool shuffle);

// Weighted sampling with replacement: `count` draws with probability ∝ weights[i], seeded with
// seed + epoch. For DDP, every rank draws the same global sequence and takes its shard of it.
std::vector<std::int64_t> weighted_indices(const std::vector<double>& weights, std::int64_t count, int rank, int world,
                                           std::uint64_t seed, std::int64_t epoch);

// Per-sample weights 1 / (frequency of its class): every class is drawn equally often on average.
std::vector<double> inverse_class_frequency(const std::vector<std::int64_t>& labels, int classes);

}  // namespace gpuq::worker
