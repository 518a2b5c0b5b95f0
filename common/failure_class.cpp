// Failure classes from a log's last lines (see failure_class.hpp).
#include "common/failure_class.hpp"

#include <array>
#include <cctype>

namespace gpuq::common {

namespace {

struct Pattern {
  const char* cls;
  std::array<const char*, 2> all;  // every one of them in the line (nullptr: none more)
};

// In order: the first that matches a line names its class.
constexpr Pattern k_patterns[] = {
    {"cuda_oom", {"CUDA out of memory", nullptr}},
    {"cuda_oom", {"CUDA error: out of memory", nullptr}},
    {"cuda_oom", {"cudaErrorMemoryAllocation", nullptr}},
    {"cuda_oom", {"CUBLAS_STATUS_ALLOC_FAILED", nullptr}},
    {"collective_timeout", {"collective operation timeout", nullptr}},
    {"collective_timeout", {"NCCL", "timeout"}},
    {"collective_timeout", {"NCCL", "timed out"}},
    {"collective_timeout", {"gloo", "Timed out waiting"}},
    {"nccl_error", {"NCCL error", nullptr}},
    {"cuda_error", {"CUDA error: ", nullptr}},
    {"diverged", {"training diverged", nullptr}},  // gpuq-worker's words (trainer.cpp)
};

const char* class_of(std::string_view line) {
  for (const auto& p : k_patterns) {
    bool all = true;
    for (const char* s : p.all) all = all && (!s || line.find(s) != std::string_view::npos);
    if (all) return p.cls;
  }
  return nullptr;
}

}  // namespace

std::string printable_line(std::string_view line, std::size_t max) {
  if (const auto cr = line.find_last_of('\r'); cr != std::string_view::npos && cr + 1 < line.size())
    line = line.substr(cr + 1);
  std::string text;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c == 0x1b) {  // an ANSI escape (colours): up to its final letter
      while (i + 1 < line.size() && !std::isalpha(static_cast<unsigned char>(line[i + 1]))) ++i;
      ++i;
    } else if (c >= 0x20 && c != 0x7f) {
      text += static_cast<char>(c);
    } else if (c == '\t') {
      text += ' ';
    }
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  const auto first = text.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  text = text.substr(first);
  if (text.size() > max) {
    std::size_t cut = max;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a whole UTF-8 character
    text = text.substr(0, cut) + "...";
  }
  return text;
}

std::optional<FailureClass> classify_failure(std::string_view tail) {
  std::size_t end = tail.size();
  while (end > 0) {
    const std::size_t nl = tail.rfind('\n', end - 1);
    const std::size_t begin = nl == std::string_view::npos ? 0 : nl + 1;
    const std::string_view line = tail.substr(begin, end - begin);
    end = nl == std::string_view::npos ? 0 : nl;
    if (line.size() > 64 * 1024) continue;  // no message is that long; not worth the search
    if (const char* cls = class_of(line)) return FailureClass{cls, printable_line(line)};
  }
  return std::nullopt;
}

bool is_failure_class(std::string_view name) { return !failure_class_words(name).empty(); }

std::string failure_class_words(std::string_view name) {
  if (name == "cuda_oom") return "CUDA out of memory";
  if (name == "collective_timeout")
    return "a collective operation timed out (a rank stalled or died, or the network between them failed)";
  if (name == "nccl_error") return "NCCL error";
  if (name == "cuda_error") return "CUDA error";
  if (name == "diverged") return "training diverged (the loss is not finite)";
  return "";
}

}  // namespace gpuq::common
