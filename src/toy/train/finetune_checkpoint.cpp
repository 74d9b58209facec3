// checkpoint.gguf of a `toy finetune` run (not a model file: the frozen weights stay in the
// base and donor files, which it names and identifies):
//   toy.finetune.version   u32, the layout below (kFinetuneCheckpointVersion)
//   toy.finetune.options   JSON: the FinetuneOptions, resolved (ctx, steps, min_lr)
//   toy.finetune.state     JSON: step, optimizer steps, epoch, position in the epoch's order,
//                          the dropout stream's offset, the loss scale, tokens and time so far,
//                          the logging window, the best validation step and loss, and the
//                          identity (path, size, XXH3 hash) of the base, donor and data files
//   param.<name>           every trainable tensor (F32)
//   opt.m.<name>, opt.v.<name>  its AdamW moments
//   best.<name>            the trainable tensors at the best validation loss (when one exists)
// Loading trusts nothing: each value is checked before it is used.
#include <filesystem>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune_run.h"
#include "toy/train/run_state.h"

namespace fs = std::filesystem;

namespace toy {

namespace {

nlohmann::json identity_json(const FileIdentity& f) {
  if (f.path.empty()) return nullptr;
  return {{"path", f.path}, {"bytes", f.bytes}, {"hash", hex(f.hash)}};
}

FileIdentity identity_from(const nlohmann::json& st, const char* key, const std::string& where) {
  using namespace json_fields;
  FileIdentity f;
  const auto it = st.find(key);
  TOY_CHECK(it != st.end(), "{}: missing field '{}'", where, key);
  if (it->is_null()) return f;
  const std::string w = where + " " + key;
  TOY_CHECK(it->is_object(), "{}: field '{}' must be an object or null", where, key);
  f.path = get_string(*it, "path", w);
  f.bytes = get_uint(*it, "bytes", w);
  f.hash = parse_hex(*it, "hash", w);
  return f;
}

}  // namespace

std::string finetune_checkpoint_path(const std::string& dir) { return (fs::path(dir) / "checkpoint.gguf").string(); }

void save_finetune_checkpoint(FinetuneRun& r) {
  gguf::Writer w;
  w.set("toy.finetune.version", gguf::Value::u32(kFinetuneCheckpointVersion));
  w.set("general.name", gguf::Value::str("toy finetune checkpoint"));
  for (const Param& p : r.model->params().all()) {
    if (!p.trainable) continue;
    const int64_t bad = first_non_finite(p.value);
    TOY_CHECK(bad < 0, "[finetune]: weight '{}' holds a non-finite value (element {}): not writing checkpoint.gguf",
              p.name, bad);
    w.add_tensor("param." + p.name, p.value.detach());
    w.add_tensor("opt.m." + p.name, p.m);
    w.add_tensor("opt.v." + p.name, p.v);
  }
  r.loop.best.add_to(w, r.model->params());
  const LoopState& loop = r.loop;
  nlohmann::json state = {{"step", loop.step},
                          {"optimizer_steps", r.opt->steps()},
                          {"epoch", r.epoch},
                          {"cursor", r.cursor},
                          {"pending", r.pending},
                          {"dropout_rng", uint64_t(loop.step) << 32},  // where the next step's masks start
                          {"loss_scale", loop.loss_scale.scale()},
                          {"loss_scale_good_steps", loop.loss_scale.good_steps()},
                          {"tokens", loop.units},
                          {"seconds", loop.seconds},
                          {"window_loss", r.window_loss},
                          {"window_steps", r.window_steps},
                          {"skipped_steps", loop.skipped_steps},
                          {"best_step", loop.best.step},
                          {"best_val_loss", loop.best.has() ? loop.best.score : 0.0},
                          {"base", identity_json(r.base_id)},
                          {"donor", identity_json(r.donor_id)},
                          {"data", identity_json(r.data_id)},
                          // the processes whose steps these were (a resume keeps the global batch)
                          {"world_size", loop.world_size}};
  if (std::isfinite(r.train_loss)) state["train_loss"] = r.train_loss;
  w.set("toy.finetune.options", gguf::Value::str(r.o.to_json().dump()));
  w.set("toy.finetune.state", gguf::Value::str(state.dump()));
  w.write(finetune_checkpoint_path(r.o.out));
}

int64_t saved_world_size(const gguf::Reader& rd) {
  const std::string w = fmt::format("[finetune] checkpoint '{}' key toy.finetune.state", printable(rd.path()));
  const nlohmann::json st = json_fields::parse_object(rd.get_str("toy.finetune.state"), w);
  const int64_t n = st.contains("world_size") ? json_fields::get_int(st, "world_size", w) : 1;
  TOY_CHECK(n >= 1 && n <= 1 << 20, "{}: world_size {} is outside 1..1048576", w, n);
  return n;
}

FinetuneOptions read_finetune_checkpoint_options(const gguf::Reader& rd, const std::string& dir) {
  const std::string shown = printable(rd.path());
  TOY_CHECK(!rd.has("toy.checkpoint.version"), "[finetune] '{}' is the checkpoint of a toy train run: continue it "
            "with toy train --resume {}", shown, printable(dir));
  const gguf::Value* ver = rd.find("toy.finetune.version");
  TOY_CHECK(ver != nullptr, "[finetune] '{}' has no toy.finetune.version: it is not a toy finetune checkpoint", shown);
  TOY_CHECK(ver->type == gguf::Type::U32 && ver->u == kFinetuneCheckpointVersion,
            "[finetune] '{}' is a checkpoint of format version {}; this toy reads version {}", shown,
            ver->type == gguf::Type::U32 ? std::to_string(ver->u) : std::string("(not a u32)"),
            kFinetuneCheckpointVersion);
  const std::string where = fmt::format("[finetune] checkpoint '{}' key toy.finetune.options", shown);
  FinetuneOptions o = FinetuneOptions::from_json(json_fields::parse_object(rd.get_str("toy.finetune.options"), where),
                                                 where);
  TOY_CHECK(o.ctx > 0 && o.steps > 0, "{}: ctx and steps must be resolved (got {} and {})", where, o.ctx, o.steps);
  o.out = dir;
  return o;
}

void read_finetune_checkpoint_files(const gguf::Reader& rd, FileIdentity& base, FileIdentity& donor,
                                    FileIdentity& data) {
  const std::string w = fmt::format("[finetune] checkpoint '{}' key toy.finetune.state", printable(rd.path()));
  const nlohmann::json st = json_fields::parse_object(rd.get_str("toy.finetune.state"), w);
  base = identity_from(st, "base", w);
  donor = identity_from(st, "donor", w);
  data = identity_from(st, "data", w);
}

void load_finetune_checkpoint(FinetuneRun& r, const gguf::Reader& rd) {
  using namespace json_fields;
  const std::string shown = printable(rd.path());
  size_t trainable = 0;
  for (Param& p : r.model->params().all()) {
    if (!p.trainable) continue;
    ++trainable;
    load_checked(rd, "param." + p.name, p.value, false, "[finetune]");
    load_checked(rd, "opt.m." + p.name, p.m, false, "[finetune]");
    load_checked(rd, "opt.v." + p.name, p.v, true, "[finetune]");
  }
  size_t params_in_file = 0;
  for (const gguf::TensorInfo& t : rd.tensors())
    if (t.name.rfind("param.", 0) == 0) ++params_in_file;
  TOY_CHECK(params_in_file == trainable, "[finetune] checkpoint '{}' holds {} trainable tensors; the run it describes "
            "trains {}", shown, params_in_file, trainable);

  const std::string w = fmt::format("[finetune] checkpoint '{}' key toy.finetune.state", shown);
  const nlohmann::json st = parse_object(rd.get_str("toy.finetune.state"), w);
  LoopState& loop = r.loop;
  const int64_t step = loop.step = get_int(st, "step", w);
  TOY_CHECK(step >= 0 && step <= r.o.steps, "{}: step {} is outside the run's 0..{} steps", w, step, r.o.steps);
  const int64_t opt_steps = get_int(st, "optimizer_steps", w);
  TOY_CHECK(opt_steps >= 0 && opt_steps <= step, "{}: {} optimizer steps for {} training steps", w, opt_steps,
            step);
  r.opt->set_steps(opt_steps);
  r.epoch = get_int(st, "epoch", w);
  TOY_CHECK(r.epoch >= -1 && r.epoch <= (int64_t(1) << 40), "{}: epoch {} is out of range", w, r.epoch);
  const int64_t cursor = get_int(st, "cursor", w);
  TOY_CHECK(cursor >= 0 && size_t(cursor) <= r.train.size(), "{}: cursor {} is outside the {} training examples", w,
            cursor, r.train.size());
  r.cursor = size_t(cursor);
  r.pending = get_bool(st, "pending", w);
  TOY_CHECK(!r.pending || (r.o.pack && r.cursor > 0), "{}: a pending example without a packed row before it", w);
  r.dropout_gen = Generator(r.o.seed, kFinetuneDropoutStream);
  (void)get_uint(st, "dropout_rng", w);  // addressed by step and micro-batch: checked, not needed
  const float scale = get_float(st, "loss_scale", w);
  const int64_t good = get_int(st, "loss_scale_good_steps", w);
  TOY_CHECK(scale >= 1 && good >= 0, "{}: loss scale {} / {} good steps is out of range", w, scale, good);
  loop.loss_scale.restore(scale, good);
  loop.units = get_int(st, "tokens", w);
  loop.seconds = get_double(st, "seconds", w);
  r.window_loss = get_double(st, "window_loss", w);
  r.window_steps = get_int(st, "window_steps", w);
  loop.skipped_steps = get_int(st, "skipped_steps", w);
  TOY_CHECK(loop.units >= 0 && loop.seconds >= 0 && r.window_steps >= 0 && loop.skipped_steps >= 0,
            "{}: a negative count (tokens, seconds, window or skipped steps)", w);
  r.train_loss = st.contains("train_loss") ? get_double(st, "train_loss", w) : NAN;
  const int64_t best_step = get_int(st, "best_step", w);
  TOY_CHECK(best_step >= -1 && best_step <= step, "{}: best_step {} is outside -1..{}", w, best_step, step);
  loop.best.load(rd, r.model->params(), best_step, get_double(st, "best_val_loss", w), 0, "[finetune]");
  loop.world_size = st.contains("world_size") ? get_int(st, "world_size", w) : 1;
  TOY_CHECK(loop.world_size >= 1 && loop.world_size <= 1 << 20, "{}: world_size {} is outside 1..1048576", w,
            loop.world_size);
  loop.saved_step = step;
  if (r.epoch >= 0) shuffle_epoch(r);  // the epoch's order is the seed's: rebuilt, not stored
}

}  // namespace toy
