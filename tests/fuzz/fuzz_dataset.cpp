// libFuzzer target: a dataset file, as a job's spec may name any, through gpuq-worker's loaders
// (worker/data.hpp: no LibTorch). The first byte picks the path: an IDX file read as it is, the
// same gzipped, a CSV training file, or an IDX dataset directory whose four files are cut from
// the input. A crash, a sanitizer report, an allocation past libFuzzer's limit (a header's word
// taken for memory), or a dataset that loads inconsistent (sizes that disagree, a label past the
// classes, a feature that is not finite) is a bug: a bad file must be a clear error.
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "worker/data.hpp"

namespace {

const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/gpuq-fuzz-dataset-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    return std::string(tmpl);
  }();
  return dir;
}

void write_file(const std::string& path, std::string_view bytes, bool gzip) {
  if (gzip) {
    gzFile g = gzopen(path.c_str(), "wb1");
    if (!g) std::abort();
    if (!bytes.empty() && gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())) <= 0) std::abort();
    gzclose(g);
    return;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

void check(const gpuq::worker::Dataset& d) {
  using gpuq::worker::Split;
  if (d.features <= 0) std::abort();
  for (const Split* s : {&d.train, &d.test}) {
    if (s->n < 0 || s->x.size() != static_cast<std::size_t>(s->n) * static_cast<std::size_t>(d.features)) std::abort();
    for (float v : s->x)
      if (!std::isfinite(v)) std::abort();
    if (d.classes > 0) {
      if (s->labels.size() != static_cast<std::size_t>(s->n)) std::abort();
      for (auto l : s->labels)
        if (l < 0 || l >= d.classes) std::abort();
    }
  }
  if (d.train.n == 0) std::abort();  // an empty training set is refused, never trained on
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuq::worker;
  if (size < 1) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string& dir = scratch();
  switch (data[0] % 4) {
    case 0:
    case 1: {
      const std::string path = dir + (data[0] % 4 ? "/one.gz" : "/one");
      write_file(path, in, data[0] % 4 == 1);
      auto a = read_idx(path);
      if (a) {
        std::uint64_t count = 1;
        for (auto d : a->dims) count *= d;
        if (a->dims.empty() || a->data.size() != count) std::abort();
      }
      ::unlink(path.c_str());
      break;
    }
    case 2: {
      const std::string path = dir + "/train.csv";
      write_file(path, in, false);
      gpuq::common::DatasetSpec spec;
      spec.kind = "csv";
      spec.path = path;
      auto d = load_dataset(spec, 1);
      if (d) check(*d);
      ::unlink(path.c_str());
      break;
    }
    default: {
      // Four files cut at lengths the next three bytes choose (the rest to the last one).
      const char* names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                              "t10k-labels-idx1-ubyte"};
      std::string_view rest = in.substr(in.size() >= 3 ? 3 : in.size());
      for (int i = 0; i < 4; ++i) {
        std::size_t len = i < 3 && static_cast<std::size_t>(i) < in.size()
                              ? std::min<std::size_t>(rest.size(), static_cast<unsigned char>(in[i]))
                              : rest.size();
        write_file(dir + "/" + names[i], rest.substr(0, len), false);
        rest.remove_prefix(len);
      }
      gpuq::common::DatasetSpec spec;
      spec.kind = "idx";
      spec.path = dir;
      auto d = load_dataset(spec, 1);
      if (d) check(*d);
      for (auto* n : names) ::unlink((dir + "/" + n).c_str());
    }
  }
  return 0;
}
