// Failure classes read from a failed rank's log (common/failure_class.hpp).
#include <doctest/doctest.h>

#include "common/failure_class.hpp"

using gpuq::common::classify_failure;
using gpuq::common::failure_class_words;
using gpuq::common::is_failure_class;
using gpuq::common::printable_line;

TEST_CASE("a PyTorch CUDA out-of-memory traceback is cuda_oom, named by its last line") {
  const auto c = classify_failure(
      "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    y = model(x)\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
      "79.19 GiB of which 3.2 GiB is free.\n");
  REQUIRE(c);
  CHECK(c->name == "cuda_oom");
  CHECK(c->line.rfind("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.", 0) == 0);
  CHECK(classify_failure("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be reported later\n")->name ==
        "cuda_oom");
}

TEST_CASE("NCCL's watchdog timeout is found above the stack frames printed after it") {
  const auto c = classify_failure(
      "[rank1]:[E1125 10:00:00] [PG 0 Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
      "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
      "terminate called after throwing an instance of 'c10::DistBackendError'\n"
      "frame #0: c10::Error::Error + 0x9c\nframe #1: clone + 0x44\n");
  REQUIRE(c);
  CHECK(c->name == "collective_timeout");
  CHECK(c->line.find("Watchdog caught collective operation timeout") != std::string::npos);
  CHECK(classify_failure("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                         "waiting 1800000ms for recv operation to complete\n")
            ->name == "collective_timeout");
  CHECK(classify_failure("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
                         "system error\n")
            ->name == "nccl_error");
  CHECK(classify_failure("RuntimeError: CUDA error: an illegal memory access was encountered\n")->name == "cuda_error");
  CHECK(classify_failure("gpuq-worker: rank 0: training diverged at epoch 1: the loss is nan\n")->name == "diverged");
}

TEST_CASE("a log that names no known failure has no class; the last one named wins") {
  CHECK(!classify_failure("ValueError: no column \"label\"\n"));
  CHECK(!classify_failure(""));
  CHECK(!classify_failure("\n\n"));
  const auto c = classify_failure("RuntimeError: CUDA error: out of memory\nretrying\nNCCL error: remote process exited\n");
  REQUIRE(c);
  CHECK(c->name == "nccl_error");
}

TEST_CASE("the line is printable: a terminal's view after carriage returns, no escapes, at most 400 bytes") {
  CHECK(printable_line("progress 10%\rprogress 90%\r\x1b[31mCUDA out of memory\x1b[0m\t ") == "CUDA out of memory");
  const std::string long_line = "CUDA out of memory " + std::string(1000, 'x');
  const auto c = classify_failure(long_line);
  REQUIRE(c);
  CHECK(c->line.size() == 403);
  CHECK(c->line.substr(400) == "...");
  CHECK(printable_line(std::string(399, 'a') + "\xc3\xa9") == std::string(399, 'a') + "...");  // never half a character
  CHECK(printable_line("   ").empty());
}

TEST_CASE("only the classes it gives are accepted back, each with words") {
  for (const char* name : {"cuda_oom", "collective_timeout", "nccl_error", "cuda_error", "diverged"}) {
    CHECK(is_failure_class(name));
    CHECK(!failure_class_words(name).empty());
  }
  CHECK(!is_failure_class("root_shell"));
  CHECK(!is_failure_class(""));
}
