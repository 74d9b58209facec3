// checkpoint.gguf: the model (as model.gguf has it) plus
//   toy.checkpoint.version   u32, the layout below (kCheckpointVersion)
//   toy.train.options        JSON: the TrainOptions the run was started with
//   toy.train.state          JSON: step, optimizer steps, random stream offsets, time and
//                            tokens so far, the best validation step and loss, and the
//                            corpus identity (hash of the text; path, size and hash per file)
//   opt.m.<param>, opt.v.<param>  AdamW moments
//   best.<param>             the best-validation weights (when an evaluation has run)
// Loading trusts nothing: each value is checked before it is used.
#include <charconv>
#include <cmath>
#include <filesystem>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/ops/ops.h"
#include "toy/train/run_state.h"

namespace fs = std::filesystem;

namespace toy {

std::string checkpoint_path(const std::string& dir) { return (fs::path(dir) / "checkpoint.gguf").string(); }

int64_t first_non_finite(const Tensor& t) {
  if (t.dtype() == DType::F32 && t.is_contiguous() && is_host(t.device())) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  }
  const std::vector<float> v = t.to_f32_vector();
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return int64_t(i);
  return -1;
}

void require_finite_weights(const DecoderLM& m, const std::string& context, const std::string& consequence) {
  for (const Tensor& p : m.params().values()) {
    const int64_t i = first_non_finite(p);
    TOY_CHECK(i < 0, "{}: weight '{}' holds {} (element {}){}", context, p.name(),
              p.detach().to_f32_vector()[size_t(i)], i, consequence);
  }
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t parse_hex(const nlohmann::json& j, const char* key, const std::string& where) {
  const std::string s = json_fields::get_string(j, key, where);
  uint64_t v = 0;
  const bool ok = s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos &&
                  std::from_chars(s.data(), s.data() + s.size(), v, 16).ec == std::errc();
  TOY_CHECK(ok,
            "{}: field '{}' must be 16 hex digits, got '{}'", where, key, printable(s, 40));
  return v;
}

void load_checked(const gguf::Reader& rd, const std::string& name, Tensor& dst, bool non_negative, const char* who) {
  const std::string shown = printable(rd.path());
  const gguf::TensorInfo* ti = rd.find_tensor(name);
  TOY_CHECK(ti != nullptr, "{} checkpoint '{}': missing tensor '{}'", who, shown, name);
  TOY_CHECK(ti->shape == dst.shape(), "{} checkpoint '{}': tensor '{}' has shape {}, expected {}", who, shown, name,
            ti->shape.str(), dst.shape().str());
  NoGradGuard ng;
  copy_(dst, rd.tensor(name));
  const int64_t bad = first_non_finite(dst);
  TOY_CHECK(bad < 0, "{} checkpoint '{}': tensor '{}' holds non-finite values (element {}): the checkpoint is "
            "damaged or was saved from a diverged run", who, shown, name, bad);
  if (non_negative) {
    const std::vector<float> v = dst.to_f32_vector();
    for (size_t i = 0; i < v.size(); ++i)
      TOY_CHECK(v[i] >= 0, "{} checkpoint '{}': tensor '{}' element {} is {}, but AdamW's second moment is never "
                "negative", who, shown, name, i, v[i]);
  }
}

namespace {

nlohmann::json corpus_json(const Run& r) {
  nlohmann::json files = nlohmann::json::array();
  for (const CorpusFile& f : r.corpus) files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"hash", hex(f.hash)}});
  return {{"hash", hex(r.corpus_hash)}, {"files", files}};
}

}  // namespace

void save_checkpoint(Run& r) {
  require_finite_weights(*r.model, "[train]", ": not writing checkpoint.gguf");
  gguf::Writer w;
  w.set("toy.checkpoint.version", gguf::Value::u32(kCheckpointVersion));
  ModelWriteOptions unfolded;
  unfolded.fold_depth_scale = false;  // the run trains on: its weights as they are
  add_model_to_gguf(w, *r.model, *r.tok, "toy checkpoint", unfolded);
  for (const Param& p : r.model->params().all()) {
    if (!p.trainable) continue;
    w.add_tensor("opt.m." + p.name, p.m);
    w.add_tensor("opt.v." + p.name, p.v);
  }
  r.loop.best.add_to(w, r.model->params());
  nlohmann::json state = {{"step", r.loop.step},
                          {"optimizer_steps", r.opt->steps()},
                          // where the next step's generators start (Generator::for_micro_batch)
                          {"data_rng", uint64_t(r.loop.step) << 32},
                          {"dropout_rng", uint64_t(r.loop.step) << 32},
                          {"train_seconds", r.loop.seconds},
                          {"tokens_seen", r.loop.units},
                          {"best_step", r.loop.best.step},
                          {"best_val_loss", r.loop.best.has() ? r.loop.best.score : 0.0},
                          {"corpus", corpus_json(r)},
                          // the processes whose steps these were (a resume keeps the global batch)
                          {"world_size", r.loop.world_size}};
  w.set("toy.train.options", gguf::Value::str(r.o.to_json().dump()));
  w.set("toy.train.state", gguf::Value::str(state.dump()));
  w.write(checkpoint_path(r.o.out));
}

void load_checkpoint(Run& r, const std::string& dir) {
  const std::string path = checkpoint_path(dir);
  std::error_code ec;
  TOY_CHECK(fs::exists(fs::symlink_status(path, ec)), "[train] no checkpoint to resume in '{}' (expected {})",
            printable(dir), printable(path));
  gguf::Reader rd(path);
  load_checkpoint(r, rd, dir);
}

void load_checkpoint(Run& r, const gguf::Reader& rd, const std::string& dir) {
  using namespace json_fields;
  const std::string shown = printable(rd.path());

  TOY_CHECK(!rd.has("toy.finetune.version"), "[train] '{}' is the checkpoint of a toy finetune run: continue it with "
            "toy finetune --resume {}", shown, printable(dir));
  const gguf::Value* ver = rd.find("toy.checkpoint.version");
  TOY_CHECK(ver != nullptr, "[train] '{}' has no toy.checkpoint.version: it was written by an older toy, whose "
            "checkpoints this one (format version {}) cannot continue", shown, kCheckpointVersion);
  TOY_CHECK(ver->type == gguf::Type::U32 && ver->u == kCheckpointVersion,
            "[train] '{}' is a checkpoint of format version {}; this toy reads version {}", shown,
            ver->type == gguf::Type::U32 ? std::to_string(ver->u) : std::string("(not a u32)"), kCheckpointVersion);

  const std::string opt_where = fmt::format("[train] checkpoint '{}' key toy.train.options", shown);
  r.o = TrainOptions::from_json(parse_object(rd.get_str("toy.train.options"), opt_where), opt_where);
  r.o.out = dir;

  LoadedModel lm = load_model(rd, LoadMode::Train);
  TOY_CHECK(lm.model->config().to_json() == r.o.model.to_json(),
            "[train] checkpoint '{}': its model config ({}) is not the one its training options name ({})", shown,
            lm.model->config().to_json().dump(), r.o.model.to_json().dump());
  r.model = std::move(lm.model);
  r.tok = std::move(lm.tokenizer);
  require_finite_weights(*r.model, fmt::format("[train] checkpoint '{}'", shown),
                         ", a non-finite value: the checkpoint is damaged or was saved from a diverged run");
  r.opt = std::make_unique<AdamW>(r.model->params(), AdamWConfig{r.o.beta1, r.o.beta2, 1e-8f, r.o.weight_decay});
  for (Param& p : r.model->params().all()) {
    if (!p.trainable) continue;
    load_checked(rd, "opt.m." + p.name, p.m, false, "[train]");
    load_checked(rd, "opt.v." + p.name, p.v, true, "[train]");
  }

  const std::string st_where = fmt::format("[train] checkpoint '{}' key toy.train.state", shown);
  const nlohmann::json st = parse_object(rd.get_str("toy.train.state"), st_where);
  int64_t& step = r.loop.step;
  step = get_int(st, "step", st_where);
  TOY_CHECK(step >= 0 && step <= r.o.steps, "{}: step {} is outside the run's 0..{} steps", st_where, step,
            r.o.steps);
  const int64_t opt_steps = get_int(st, "optimizer_steps", st_where);
  TOY_CHECK(opt_steps == step, "{}: {} optimizer steps for {} training steps", st_where, opt_steps, step);
  r.opt->set_steps(opt_steps);
  // The generators are addressed by step and micro-batch: data_rng and dropout_rng (the
  // counters the next step starts at; sequential offsets before micro-batch addressing) are
  // checked to be there, not needed.
  r.data_gen = Generator(r.o.seed, kDataStream);
  r.dropout_gen = Generator(r.o.seed, kDropoutStream);
  (void)get_uint(st, "data_rng", st_where);
  (void)get_uint(st, "dropout_rng", st_where);
  r.loop.seconds = get_double(st, "train_seconds", st_where);
  TOY_CHECK(r.loop.seconds >= 0, "{}: train_seconds is negative ({})", st_where, r.loop.seconds);
  r.loop.units = get_int(st, "tokens_seen", st_where);
  TOY_CHECK(r.loop.units >= 0, "{}: tokens_seen is negative ({})", st_where, r.loop.units);

  const int64_t best_step = get_int(st, "best_step", st_where);
  TOY_CHECK(best_step >= -1 && best_step <= step, "{}: best_step {} is outside -1..{}", st_where, best_step, step);
  r.loop.best.load(rd, r.model->params(), best_step, get_double(st, "best_val_loss", st_where), 0, "[train]");

  const nlohmann::json& corpus = get_object(st, "corpus", st_where);
  r.corpus_hash = parse_hex(corpus, "hash", st_where + " corpus");
  r.corpus.clear();
  for (const nlohmann::json& f : get_array(corpus, "files", st_where + " corpus")) {
    const std::string fw = st_where + " corpus file";
    r.corpus.push_back({get_string(f, "path", fw), get_uint(f, "bytes", fw), parse_hex(f, "hash", fw)});
  }
  r.loop.world_size = st.contains("world_size") ? get_int(st, "world_size", st_where) : 1;
  TOY_CHECK(r.loop.world_size >= 1 && r.loop.world_size <= 1 << 20, "{}: world_size {} is outside 1..1048576",
            st_where, r.loop.world_size);
  r.loop.saved_step = step;
}

}  // namespace toy
