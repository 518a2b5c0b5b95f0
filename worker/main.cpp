// gpuq-worker: trains a model described by a `train` spec, alone or as one rank of a DDP gang.
// gpuqd runs it for jobs with a `train` section; it also runs by hand for debugging:
//   gpuq-worker --spec job.json          (a job spec with "train", or the train object itself)
//   RANK=0 WORLD_SIZE=2 MASTER_PORT=29500 gpuq-worker --spec job.json &   (and RANK=1 …)
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>
#include <torch/version.h>  // macros only: this TU stays free of LibTorch proper

#include "common/train_spec.hpp"
#include "worker/trainer.hpp"

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}
}  // namespace

int main(int argc, char** argv) {
  // Parse the command line
  CLI::App app{"gpuq-worker: trains a model from a gpuq `train` spec (alone or as a DDP rank)"};
  app.set_version_flag("--version", std::string(GPUQ_VERSION) + " (LibTorch " TORCH_VERSION ", backends: " +
                                         gpuq::worker::available_backends() + ")");
  std::string spec_file, spec_text;
  gpuq::worker::RunOptions options;
  auto* file = app.add_option("--spec", spec_file, "JSON file: a job spec with a `train` section, or the section itself");
  app.add_option("--train", spec_text, "The `train` section as a JSON string")->excludes(file);
  app.add_option("--dump-params", options.dump_params, "Write the final parameters to this file (JSON)");
  std::string checkpoint_dir;
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "Save checkpoints here and resume from the newest (default: $GPUQ_CHECKPOINT_DIR)");
  app.add_flag("--emulate-cuda-graph", options.emulate_cuda_graph,
               "Test aid: with train.cuda_graph, run the graph step's data flow without CUDA (each "
               "replay runs the captured passes again)");
  app.add_flag("--fail-capture", options.fail_capture,
               "Test aid: with train.cuda_graph, the step's capture fails (emulated with --emulate-cuda-graph; on "
               "CUDA the captured body waits for the device, which capture forbids)");
  CLI11_PARSE(app, argc, argv);

  // Read and validate the train spec
  nlohmann::json doc;
  try {
    if (!spec_file.empty()) {
      std::ifstream in(spec_file);
      if (!in) throw std::runtime_error("cannot read " + spec_file);
      doc = nlohmann::json::parse(in);
    } else if (!spec_text.empty()) {
      doc = nlohmann::json::parse(spec_text);
    } else {
      std::cerr << "gpuq-worker: give --spec FILE or --train JSON\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "gpuq-worker: the spec is not valid JSON: " << e.what() << "\n";
    return 2;
  }
  if (doc.is_object() && doc.contains("train")) doc = doc["train"];
  auto spec = gpuq::common::parse_train(doc);
  if (!spec) {
    std::cerr << "gpuq-worker: " << spec.error().message << "\n";
    return 2;
  }
  options.spec = *spec;

  // Take the rank's place from the torchrun environment
  options.rank = env_int("RANK", 0);
  options.world = env_int("WORLD_SIZE", 1);
  options.distributed = std::getenv("WORLD_SIZE") != nullptr;
  options.local_rank = env_int("LOCAL_RANK", 0);
  options.master_addr = env_str("MASTER_ADDR", "127.0.0.1");
  options.master_port = env_int("MASTER_PORT", 29500);
  options.events = env_str("GPUQ_EVENTS", "");
  options.checkpoint_dir = checkpoint_dir.empty() ? env_str("GPUQ_CHECKPOINT_DIR", "") : checkpoint_dir;
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    std::cerr << "gpuq-worker: RANK " << options.rank << " is not within WORLD_SIZE " << options.world << "\n";
    return 2;
  }

  // Train
  try {
    return gpuq::worker::train(options);
  } catch (const std::exception& e) {
    std::cerr << "gpuq-worker: rank " << options.rank << ": " << e.what() << "\n";
    return 1;
  }
}
