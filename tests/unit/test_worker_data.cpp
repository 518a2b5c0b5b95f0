// Worker datasets and samplers, without LibTorch: IDX and CSV parsing with their errors,
// synthetic data, standardisation, and the sampler properties DDP correctness rests on.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "worker/data.hpp"
#include "worker/sampler.hpp"

using namespace gpuq::worker;

namespace {
std::string tmp(const std::string& name) { return "/tmp/gpuq-unit-" + std::to_string(::getpid()) + "-" + name; }

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::uint8_t fill_from = 0) {
  std::vector<std::uint8_t> b{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  std::size_t count = 1;
  for (auto d : dims) {
    b.insert(b.end(), {static_cast<std::uint8_t>(d >> 24), static_cast<std::uint8_t>(d >> 16),
                       static_cast<std::uint8_t>(d >> 8), static_cast<std::uint8_t>(d)});
    count *= d;
  }
  for (std::size_t i = 0; i < count; ++i) b.push_back(static_cast<std::uint8_t>(fill_from + i));
  return b;
}

void write_raw(const std::string& path, const std::vector<std::uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}
}  // namespace

TEST_SUITE_BEGIN("worker_data");

TEST_CASE("IDX files are read plain or gzipped") {
  auto b = idx_bytes({3, 2, 2});
  write_raw(tmp("plain.idx"), b);
  write_gz(tmp("packed.idx.gz"), b);
  for (auto path : {tmp("plain.idx"), tmp("packed.idx.gz")}) {
    auto a = read_idx(path);
    REQUIRE(a.ok());
    CHECK(a->dims == std::vector<std::uint32_t>{3, 2, 2});
    CHECK(a->data.size() == 12);
    CHECK(a->data[11] == 11);
    std::remove(path.c_str());
  }
}

TEST_CASE("broken IDX files get errors that say what is wrong") {
  write_raw(tmp("bad-magic"), {1, 2, 3, 4, 5});
  CHECK(read_idx(tmp("bad-magic")).error().message.find("bad magic number") != std::string::npos);
  auto b = idx_bytes({4, 2});
  b.resize(b.size() - 3);
  write_raw(tmp("short"), b);
  CHECK(read_idx(tmp("short")).error().message.find("header says 8 values, file has 5") != std::string::npos);
  auto f = idx_bytes({2});
  f[2] = 0x0D;  // float IDX
  write_raw(tmp("float"), f);
  CHECK(read_idx(tmp("float")).error().message.find("only unsigned bytes") != std::string::npos);
  CHECK(read_idx(tmp("missing")).error().code == gpuq::ErrorCode::not_found);
  for (auto n : {"bad-magic", "short", "float"}) std::remove(tmp(n).c_str());
}

TEST_CASE("an IDX dataset directory loads both splits and is standardised") {
  std::string dir = tmp("idxdir");
  ::mkdir(dir.c_str(), 0700);
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_bytes({6, 2, 2}, 10));
  write_raw(dir + "/train-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 6, 0, 1, 2, 0, 1, 2});
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes({2, 2, 2}));
  write_raw(dir + "/t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 2, 1, 0});
  gpuq::common::DatasetSpec spec;
  spec.kind = "idx";
  spec.path = dir;
  auto d = load_dataset(spec, 0);
  REQUIRE(d.ok());
  CHECK(d->features == 4);
  CHECK(d->classes == 3);
  CHECK(d->train.n == 6);
  CHECK(d->test.n == 2);
  double mean = 0;
  for (int i = 0; i < 6; ++i) mean += d->train.x[i * 4];
  CHECK(std::fabs(mean / 6) < 1e-5);  // standardised with the training split's statistics
  spec.path = dir + "/nope";
  CHECK(load_dataset(spec, 0).error().message.find("has no train-images-idx3-ubyte[.gz]") != std::string::npos);
  for (auto n : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte"})
    std::remove((dir + "/" + n).c_str());
  ::rmdir(dir.c_str());
}

long max_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss >> 10;
}

TEST_CASE("an IDX file is read no further than its header promises, its sizes checked") {
  // A gzip bomb: a header of 1x28x28 values, then 256 MiB of zeros (~256 KiB gzipped).
  const std::string bomb = tmp("bomb.gz");
  {
    gzFile f = gzopen(bomb.c_str(), "wb9");
    const auto head = idx_bytes({1, 28, 28});
    gzwrite(f, head.data(), static_cast<unsigned>(head.size()));
    std::vector<std::uint8_t> zeros(1 << 20);
    for (int i = 0; i < 256; ++i) gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size()));
    gzclose(f);
  }
  const long before = max_rss_mib();
  auto a = read_idx(bomb);
  REQUIRE_FALSE(a.ok());
  CHECK(a.error().message.find("header says 784 values, file has more") != std::string::npos);
  CHECK(max_rss_mib() - before < 64);  // it inflated the whole 256 MiB before it looked
  // Sizes whose product wraps 64 bits (to 0 here), or passes the bound, never reach an allocation.
  write_raw(tmp("wrap"), {0, 0, 0x08, 4, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0});
  CHECK(read_idx(tmp("wrap")).error().message.find("come to more than 4294967296 values") != std::string::npos);
  write_raw(tmp("big"), {0, 0, 0x08, 2, 0x10, 0, 0, 0, 0x10, 0, 0, 1});
  CHECK(read_idx(tmp("big")).error().message.find("come to more than") != std::string::npos);
  write_raw(tmp("dims"), {0, 0, 0x08, 200});
  CHECK(read_idx(tmp("dims")).error().message.find("has 200 dimensions") != std::string::npos);
  // Not a regular file: read without end.
  CHECK(read_idx("/dev/zero").error().message.find("is not a regular file") != std::string::npos);
  for (auto f : {"bomb.gz", "wrap", "big", "dims"}) std::remove(tmp(f).c_str());
}

TEST_CASE("an IDX dataset with no samples, or test labels the training set lacks, is refused at load") {
  const std::string dir = tmp("idx-bad");
  ::mkdir(dir.c_str(), 0755);
  gpuq::common::DatasetSpec spec;
  spec.kind = "idx";
  spec.path = dir;
  write_raw(dir + "/train-images-idx3-ubyte", idx_bytes({0, 4, 4}));
  write_raw(dir + "/train-labels-idx1-ubyte", idx_bytes({0}));
  write_raw(dir + "/t10k-images-idx3-ubyte", idx_bytes({2, 4, 4}));
  write_raw(dir + "/t10k-labels-idx1-ubyte", idx_bytes({2}, 0));
  CHECK(load_dataset(spec, 0).error().message.find("train-images-idx3-ubyte holds no samples") != std::string::npos);
  write_raw(dir + "/train-images-idx3-ubyte", idx_bytes({3, 4, 4}));
  write_raw(dir + "/train-labels-idx1-ubyte", {0, 0, 0x08, 1, 0, 0, 0, 3, 0, 1, 0});
  write_raw(dir + "/t10k-labels-idx1-ubyte", {0, 0, 0x08, 1, 0, 0, 0, 2, 1, 5});
  CHECK(load_dataset(spec, 0).error().message.find("a test label is 5, and the training labels are 0 to 1") !=
        std::string::npos);
  write_raw(dir + "/t10k-labels-idx1-ubyte", {0, 0, 0x08, 1, 0, 0, 0, 2, 1, 0});
  CHECK(load_dataset(spec, 0).ok());
  for (auto f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    std::remove((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("CSV input a loader must not trust: line length, devices, CRLF, too few columns or rows, float range") {
  gpuq::common::DatasetSpec spec;
  spec.kind = "csv";
  spec.path = tmp("hostile.csv");
  {
    std::ofstream out(spec.path);
    out << "a,label\n" << std::string(k_max_csv_line + 10, '1') << ",0\n";
  }
  CHECK(load_csv(spec, 1).error().message.find("hostile.csv:2 is longer than 16 MiB") != std::string::npos);
  { std::ofstream(spec.path) << "a,label\r\n1,0\r\n2,1\r\n3,0\r\n"; }  // CRLF, the header's too
  CHECK(load_csv(spec, 1).ok());
  { std::ofstream(spec.path) << "label\n0\n1\n"; }
  CHECK(load_csv(spec, 1).error().message.find("has no feature columns") != std::string::npos);
  { std::ofstream(spec.path) << "a,label\n1,0\n"; }
  CHECK(load_csv(spec, 1).error().message.find("has 1 row; a test split needs at least 2") != std::string::npos);
  { std::ofstream(spec.path) << "a,label\n1e39,0\n2,1\n"; }
  CHECK(load_csv(spec, 1).error().message.find(":2: column \"a\" holds 1e39, past a float's range") != std::string::npos);
  std::remove(spec.path.c_str());
  spec.path = "/dev/zero";
  CHECK(load_csv(spec, 1).error().message.find("/dev/zero is not a regular file") != std::string::npos);
}

TEST_CASE("CSV datasets: label column, split, and errors with file and line") {
  std::string path = tmp("data.csv");
  {
    std::ofstream out(path);
    out << "a,label,b\n";
    for (int i = 0; i < 50; ++i) out << i << "," << i % 2 << "," << -i << "\n";
  }
  gpuq::common::DatasetSpec spec;
  spec.kind = "csv";
  spec.path = path;
  spec.test_fraction = 0.2;
  auto d = load_csv(spec, 1);
  REQUIRE(d.ok());
  CHECK(d->features == 2);
  CHECK(d->classes == 2);
  CHECK(d->train.n == 40);
  CHECK(d->test.n == 10);
  spec.label_column = "y";
  CHECK(load_csv(spec, 1).error().message.find("has no column \"y\"") != std::string::npos);
  { std::ofstream(path) << "a,label\n1,0\nx,1\n"; }
  spec.label_column = "label";
  CHECK(load_csv(spec, 1).error().message.find(":3: column \"a\" is not a number: \"x\"") != std::string::npos);
  { std::ofstream(path) << "a,label\n1,0,5\n"; }
  CHECK(load_csv(spec, 1).error().message.find("3 columns, the header has 2") != std::string::npos);
  { std::ofstream(path) << "a,label\n1,0.5\n"; }
  CHECK(load_csv(spec, 1).error().message.find("labels must be class ids") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("synthetic data is seeded, shaped as asked, and follows class weights") {
  gpuq::common::DatasetSpec spec;
  spec.samples = 5000;
  spec.features = 8;
  spec.classes = 3;
  spec.class_weights = {8, 1, 1};
  auto a = make_synthetic(spec, 7), b = make_synthetic(spec, 7), c = make_synthetic(spec, 8);
  CHECK(a.train.n + a.test.n == 5000);
  CHECK(a.train.x.size() == static_cast<std::size_t>(a.train.n) * 8);
  CHECK(a.train.x == b.train.x);
  CHECK(a.train.x != c.train.x);
  double share0 = std::count(a.train.labels.begin(), a.train.labels.end(), 0) / static_cast<double>(a.train.n);
  CHECK(share0 == doctest::Approx(0.8).epsilon(0.05));
  spec.task = "regression";
  auto r = make_synthetic(spec, 1);
  CHECK(r.classes == 0);
  CHECK(r.train.targets.size() == static_cast<std::size_t>(r.train.n));
}

TEST_CASE("DDP shards are equal-sized, disjoint up to padding, and cover the data") {
  for (std::int64_t n : {100, 101, 7}) {
    const int world = 4;
    std::multiset<std::int64_t> all;
    std::size_t size = 0;
    for (int r = 0; r < world; ++r) {
      auto s = shard_indices(n, r, world, 42, 3, true);
      if (r == 0) size = s.size();
      CHECK(s.size() == size);
      all.insert(s.begin(), s.end());
    }
    CHECK(static_cast<std::int64_t>(size) == (n + world - 1) / world);
    std::set<std::int64_t> distinct(all.begin(), all.end());
    CHECK(static_cast<std::int64_t>(distinct.size()) == n);                   // covers everything
    CHECK(static_cast<std::int64_t>(all.size()) - n == size * world - n);     // only padding repeats
  }
}

TEST_CASE("shards are reshuffled per epoch, deterministically, identically on all ranks") {
  CHECK(shard_indices(1000, 1, 2, 5, 1, true) == shard_indices(1000, 1, 2, 5, 1, true));
  CHECK(shard_indices(1000, 1, 2, 5, 1, true) != shard_indices(1000, 1, 2, 5, 2, true));
  auto seq = shard_indices(10, 1, 2, 5, 1, false);
  CHECK(seq == std::vector<std::int64_t>{1, 3, 5, 7, 9});
}

TEST_CASE("the union of the ranks' batches is the single-process batch of world x the size") {
  // Rank r takes positions r, r+w, ... of one permutation, so batch k of size B on each rank
  // covers positions [k·B·w, (k+1)·B·w) of it: the same samples one process takes with batch B·w.
  const int world = 2, b = 4;
  auto single = shard_indices(64, 0, 1, 9, 1, true);
  std::vector<std::vector<std::int64_t>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(shard_indices(64, r, world, 9, 1, true));
  for (int k = 0; k < 64 / (b * world); ++k) {
    std::set<std::int64_t> from_ranks, from_single(single.begin() + k * b * world, single.begin() + (k + 1) * b * world);
    for (const auto& s : ranks) from_ranks.insert(s.begin() + k * b, s.begin() + (k + 1) * b);
    CHECK(from_ranks == from_single);
  }
}

TEST_CASE("weighted sampling draws classes in proportion to their weights (within 3 points)") {
  std::vector<std::int64_t> labels;
  for (int i = 0; i < 1000; ++i) labels.push_back(i < 900 ? 0 : 1);  // 90% / 10%: imbalanced
  auto w = inverse_class_frequency(labels, 2);
  std::map<std::int64_t, int> drawn;
  for (auto i : weighted_indices(w, 20000, 0, 1, 3, 1)) drawn[labels[i]]++;
  CHECK(drawn[0] / 20000.0 == doctest::Approx(0.5).epsilon(0.06));  // balanced after weighting
  CHECK(drawn[1] / 20000.0 == doctest::Approx(0.5).epsilon(0.06));
  auto r0 = weighted_indices(w, 100, 0, 2, 3, 1), r1 = weighted_indices(w, 100, 1, 2, 3, 1);
  CHECK(r0.size() == 50);
  CHECK(r1.size() == 50);
}

TEST_SUITE_END();

#include "worker/loss_scale.hpp"

TEST_SUITE_BEGIN("loss_scale");

TEST_CASE("an overflowing fp16 step is skipped and halves the scale") {
  LossScale s(1024.0, 3);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 512.0);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 256.0);
}

TEST_CASE("the scale doubles after growth_interval clean steps in a row, and an overflow restarts the count") {
  LossScale s(1024.0, 3);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 1024.0);
  CHECK(s.update(false));
  CHECK(s.scale() == 2048.0);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // two clean steps, then an overflow: no growth
  CHECK(s.scale() == 1024.0);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 1024.0);
  CHECK(s.update(false));
  CHECK(s.scale() == 2048.0);
}

TEST_CASE("a scale restored from a step checkpoint goes on as the run it was saved from would have") {
  LossScale run(1024.0, 3), resumed(65536.0, 3);
  CHECK(run.update(false));
  CHECK(run.update(false));  // two clean steps of three
  resumed.restore(run.scale(), run.clean_steps());
  CHECK(resumed.scale() == 1024.0);
  CHECK(resumed.clean_steps() == 2);
  CHECK(resumed.update(false));
  CHECK(run.update(false));
  CHECK(resumed.scale() == run.scale());  // both grew at the third
  CHECK(resumed.scale() == 2048.0);
}

TEST_SUITE_END();

#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("an IDX header's word is not taken for memory: 9 bytes claiming 2^32 values read in 1 GiB") {
  const auto path = tmp("claims.idx");
  write_raw(path, {0, 0, 0x08, 1, 0xff, 0xff, 0xff, 0xff});
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // 1 GiB of address space: a 4 GiB allocation before reading fails it
    rlimit as{1ULL << 30, 1ULL << 30};
    ::setrlimit(RLIMIT_AS, &as);
    try {
      auto r = read_idx(path);
      ::_exit(!r && r.error().message.find("header says 4294967295 values, file has 0") != std::string::npos ? 0 : 1);
    } catch (...) {
      ::_exit(2);  // std::bad_alloc: the header's word was taken
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::remove(path.c_str());
}
#endif
