// Parsing of the `train` section (see train_spec.hpp).
#include "common/train_spec.hpp"

#include "common/field_reader.hpp"

namespace gpuq::common {

using json = nlohmann::json;

namespace {

DatasetSpec parse_dataset(const json& obj, const std::string& who, std::vector<std::string>& errors) {
  DatasetSpec d;
  FieldReader r(obj, who, "train.dataset", errors,
                {"kind", "path", "test_path", "test_fraction", "label_column", "task", "samples", "features",
                 "classes", "class_weights", "limit"});
  r.choice("kind", {"fashion-mnist", "mnist", "idx", "csv", "synthetic"}, d.kind);
  if (d.kind == "fashion-mnist") d.path = "/usr/share/datasets/fashion-mnist";
  r.string("path", d.path);
  r.string("test_path", d.test_path);
  r.number("test_fraction", 0.01, 0.99, d.test_fraction);
  r.string("label_column", d.label_column);
  r.choice("task", {"classification", "regression"}, d.task);
  long long x = 0;
  if (r.integer("samples", 10, 100000000, x)) d.samples = x;
  if (r.integer("features", 1, 1 << 20, x)) d.features = static_cast<int>(x);
  if (r.integer("classes", 2, 100000, x)) d.classes = static_cast<int>(x);
  r.numbers("class_weights", 0, 1e9, d.class_weights);
  if (r.integer("limit", 0, 1LL << 40, x)) d.limit = x;
  if ((d.kind == "idx" || d.kind == "csv" || d.kind == "mnist") && d.path.empty())
    r.fail("field `train.dataset.path` is needed for a \"" + d.kind + "\" dataset");
  if (d.kind != "synthetic" && r.get("class_weights"))
    r.fail("field `train.dataset.class_weights` applies to synthetic datasets only");
  if (!d.class_weights.empty() && static_cast<int>(d.class_weights.size()) != d.classes)
    r.fail("field `train.dataset.class_weights` needs one weight per class (" + std::to_string(d.classes) + ")");
  return d;
}

ModelSpec parse_model(const json& obj, const std::string& who, std::vector<std::string>& errors) {
  ModelSpec m;
  FieldReader r(obj, who, "train.model", errors,
                {"kind", "hidden", "activation", "dropout", "channels", "batch_norm", "path"});
  r.choice("kind", {"mlp", "cnn", "torchscript"}, m.kind);
  if (m.kind == "cnn") m.hidden = {128};
  r.integers("hidden", 1, 1 << 20, m.hidden);
  r.choice("activation", {"relu", "gelu", "tanh"}, m.activation);
  r.number("dropout", 0, 0.95, m.dropout);
  r.integers("channels", 1, 1 << 14, m.channels);
  r.boolean("batch_norm", m.batch_norm);
  r.string("path", m.path);
  if (m.kind != "cnn")
    for (auto f : {"channels", "batch_norm"})
      if (r.get(f)) r.fail("field `train.model." + std::string(f) + "` applies to cnn models only");
  if (m.kind == "cnn" && m.channels.empty()) r.fail("field `train.model.channels` needs at least one conv block");
  if (m.kind == "torchscript") {
    if (m.path.empty()) r.fail("field `train.model.path` is needed: a module saved with torch.jit.save");
    for (auto f : {"hidden", "activation", "dropout"})
      if (r.get(f)) r.fail("field `train.model." + std::string(f) + "` does not apply to a torchscript model");
  } else if (r.get("path")) {
    r.fail("field `train.model.path` applies to torchscript models only");
  }
  return m;
}

OptimizerSpec parse_optimizer(const json& obj, const std::string& who, std::vector<std::string>& errors) {
  OptimizerSpec o;
  FieldReader r(obj, who, "train.optimizer", errors, {"kind", "lr", "momentum", "weight_decay", "foreach"});
  r.choice("kind", {"sgd", "adam", "adamw"}, o.kind);
  if (o.kind == "sgd") o.lr = 0.01;
  r.number("lr", 1e-12, 100, o.lr);
  r.number("momentum", 0, 0.9999, o.momentum);
  r.number("weight_decay", 0, 10, o.weight_decay);
  r.boolean("foreach", o.foreach);
  if (o.kind != "sgd" && r.get("momentum")) r.fail("field `train.optimizer.momentum` applies to sgd only");
  return o;
}

ScheduleSpec parse_schedule(const json& obj, const std::string& who, std::vector<std::string>& errors) {
  ScheduleSpec sc;
  FieldReader r(obj, who, "train.schedule", errors, {"kind", "step_size", "gamma"});
  r.choice("kind", {"none", "step", "cosine"}, sc.kind);
  long long x = 0;
  if (r.integer("step_size", 1, 1 << 20, x)) sc.step_size = static_cast<int>(x);
  r.number("gamma", 1e-6, 1, sc.gamma);
  if (sc.kind != "step" && (r.get("step_size") || r.get("gamma")))
    r.fail("fields `train.schedule.step_size` and `gamma` apply to the step schedule only");
  return sc;
}

}  // namespace

int model_blocks(const ModelSpec& m) {
  return static_cast<int>(m.hidden.size()) + 1 + (m.kind == "cnn" ? static_cast<int>(m.channels.size()) : 0);
}

TrainSpec parse_train(const json& obj, const std::string& who, std::vector<std::string>& errors) {
  TrainSpec t;
  if (!obj.is_object()) {
    errors.push_back(who + ": field `train` must be an object, got " + json_type_name(obj));
    return t;
  }
  FieldReader r(obj, who, "train", errors,
                {"dataset", "model", "optimizer", "schedule", "loss", "epochs", "batch_size", "accumulate",
                 "clip_grad_norm", "sampler", "seed", "log_every", "device", "checkpoint_every", "stages",
                 "precision", "data_on", "bucket_mb", "cuda_graph", "on_nonfinite"});
  if (const json* d = r.object("dataset")) t.dataset = parse_dataset(*d, who, errors);
  else if (!r.get("dataset")) r.fail("field `train.dataset` is required, e.g. {\"kind\": \"fashion-mnist\"}");
  if (const json* m = r.object("model")) t.model = parse_model(*m, who, errors);
  if (const json* o = r.object("optimizer")) t.optimizer = parse_optimizer(*o, who, errors);
  if (const json* sc = r.object("schedule")) t.schedule = parse_schedule(*sc, who, errors);
  r.choice("loss", {"auto", "cross_entropy", "mse"}, t.loss);
  long long x = 0;
  if (r.integer("epochs", 1, 100000, x)) t.epochs = static_cast<int>(x);
  if (r.integer("batch_size", 1, 1 << 24, x)) t.batch_size = static_cast<int>(x);
  if (r.integer("accumulate", 1, 4096, x)) t.accumulate = static_cast<int>(x);
  if (t.batch_size % t.accumulate != 0)
    r.fail("field `train.batch_size` (" + std::to_string(t.batch_size) + ") must be a multiple of `train.accumulate` (" +
           std::to_string(t.accumulate) + ")");
  r.number("clip_grad_norm", 0, 1e9, t.clip_grad_norm);
  r.choice("sampler", {"shuffle", "sequential", "weighted"}, t.sampler);
  if (r.integer("seed", 0, 1LL << 62, x)) t.seed = static_cast<std::uint64_t>(x);
  if (r.integer("log_every", 1, 1 << 30, x)) t.log_every = static_cast<int>(x);
  r.choice("device", {"auto", "cpu", "cuda"}, t.device);
  if (r.integer("checkpoint_every", 0, 1 << 20, x)) t.checkpoint_every = static_cast<int>(x);
  if (r.integers("stages", 1, 1 << 16, t.stages) && !t.stages.empty()) {
    int sum = 0;
    for (int n : t.stages) sum += n;
    if (t.model.kind == "torchscript")
      r.fail("field `train.stages` needs an mlp or cnn model; a torchscript model runs on one device");
    else if (sum != model_blocks(t.model))
      r.fail("field `train.stages` must split the model's " + std::to_string(model_blocks(t.model)) +
             " blocks (conv blocks, hidden layers, output layer), but adds up to " + std::to_string(sum));
  }
  r.choice("precision", {"fp32", "bf16", "fp16"}, t.precision);
  if (t.precision == "fp16" && t.device == "cpu")
    r.fail("field `train.precision`: fp16 needs CUDA; on the CPU use \"bf16\"");
  r.choice("data_on", {"auto", "device", "host"}, t.data_on);
  r.number("bucket_mb", 0.0001, 4096, t.bucket_mb);
  r.choice("cuda_graph", {"off", "auto", "on"}, t.cuda_graph);
  r.choice("on_nonfinite", {"fail", "continue"}, t.on_nonfinite);
  if (t.model.kind == "cnn" && t.dataset.kind != "fashion-mnist" && t.dataset.kind != "mnist" && t.dataset.kind != "idx")
    r.fail("field `train.model.kind`: a cnn needs image data (an idx, mnist or fashion-mnist dataset)");
  const bool regression = t.dataset.kind == "synthetic" && t.dataset.task == "regression";
  if (t.loss == "auto") t.loss = regression ? "mse" : "cross_entropy";
  if (regression && t.loss == "cross_entropy") r.fail("field `train.loss`: cross_entropy needs a classification task");
  if (regression && t.sampler == "weighted") r.fail("field `train.sampler`: weighted sampling needs class labels");
  if (t.cuda_graph == "on")
    if (const auto why = cuda_graph_obstacle(t); !why.empty())
      r.fail("field `train.cuda_graph`: \"on\" cannot capture this step: " + why +
             " (\"auto\" falls back to eager steps)");
  return t;
}

std::string cuda_graph_obstacle(const TrainSpec& t) {
  if (t.device == "cpu") return "train.device is \"cpu\"";
  // The loss scale is a number on the host that changes between steps; a graph would freeze it.
  if (t.precision == "fp16") return "fp16's loss scale changes between steps";
  // TorchScript's profiling executor re-specialises the graph during its first runs.
  if (t.model.kind == "torchscript") return "a torchscript model is recompiled by its executor while it runs";
  return "";
}

Result<TrainSpec> parse_train(const json& obj) {
  std::vector<std::string> errors;
  TrainSpec t = parse_train(obj, "train spec", errors);
  if (errors.empty()) return t;
  std::string msg = "invalid train spec:";
  for (const auto& e : errors) msg += "\n  " + e;
  return Error{ErrorCode::invalid_spec, msg};
}

json to_json(const TrainSpec& t) {
  const auto& d = t.dataset;
  json dataset = {{"kind", d.kind}, {"limit", d.limit}};
  if (!d.path.empty()) dataset["path"] = d.path;
  if (d.kind == "csv") {
    if (!d.test_path.empty()) dataset["test_path"] = d.test_path;
    dataset["label_column"] = d.label_column;
  }
  if (d.kind == "csv" || d.kind == "synthetic") dataset["test_fraction"] = d.test_fraction;
  if (d.kind == "synthetic") {
    dataset["task"] = d.task;
    dataset["samples"] = d.samples;
    dataset["features"] = d.features;
    dataset["classes"] = d.classes;
    if (!d.class_weights.empty()) dataset["class_weights"] = d.class_weights;
  }
  json optimizer = {{"kind", t.optimizer.kind}, {"lr", t.optimizer.lr}, {"weight_decay", t.optimizer.weight_decay},
                    {"foreach", t.optimizer.foreach}};
  if (t.optimizer.kind == "sgd") optimizer["momentum"] = t.optimizer.momentum;
  json model = {{"kind", t.model.kind}};
  if (t.model.kind == "torchscript") {
    model["path"] = t.model.path;
  } else {
    model.update({{"hidden", t.model.hidden}, {"activation", t.model.activation}, {"dropout", t.model.dropout}});
    if (t.model.kind == "cnn") model.update({{"channels", t.model.channels}, {"batch_norm", t.model.batch_norm}});
  }
  json schedule = {{"kind", t.schedule.kind}};
  if (t.schedule.kind == "step") schedule.update({{"step_size", t.schedule.step_size}, {"gamma", t.schedule.gamma}});
  json out = {{"dataset", dataset},
          {"model", model},
          {"optimizer", optimizer},
          {"schedule", schedule},
          {"checkpoint_every", t.checkpoint_every},
          {"loss", t.loss},
          {"epochs", t.epochs},
          {"batch_size", t.batch_size},
          {"accumulate", t.accumulate},
          {"clip_grad_norm", t.clip_grad_norm},
          {"sampler", t.sampler},
          {"seed", t.seed},
          {"log_every", t.log_every},
          {"device", t.device},
          {"precision", t.precision},
          {"data_on", t.data_on},
          {"bucket_mb", t.bucket_mb},
          {"cuda_graph", t.cuda_graph}, {"on_nonfinite", t.on_nonfinite}};
  if (!t.stages.empty()) out["stages"] = t.stages;
  return out;
}

}  // namespace gpuq::common
