#include "toy/train/finetune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/data/sft.h"
#include "toy/infer/chat.h"
#include "toy/io/model_file.h"
#include "toy/io/quantize.h"
#include "toy/models/lora.h"
#include "toy/obs/events.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"
#include "toy/train/run_folder.h"
#include "toy/train/trainer.h"

namespace toy {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kShuffleStream = 100;  // + epoch: each epoch's order
constexpr uint64_t kDropoutStream = 2;

bool is_embedding_like(const std::string& name) {
  return name == "token_embd.weight" || name == "position_embd.weight" || name == "output.weight" ||
         name.rfind("output_norm.", 0) == 0;
}

// The merged model's type when none is asked: the base's float type, F16 for a quantized base.
std::string default_merge_type(const gguf::Reader& r, DecoderLM& m) {
  const auto projections = m.projections();
  if (projections.empty()) return "f32";
  const gguf::TensorInfo* t = r.find_tensor(projections.front().first);
  const DType dt = t ? t->dtype : DType::F32;
  return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16";
}

// Token-weighted mean loss over examples, in batches.
double mean_loss(DecoderLM& m, const std::vector<SftExample>& examples, int64_t batch) {
  NoGradGuard ng;
  double total = 0;
  int64_t counted = 0;
  for (size_t i = 0; i < examples.size(); i += size_t(batch)) {
    std::vector<const SftExample*> b;
    for (size_t j = i; j < std::min(examples.size(), i + size_t(batch)); ++j) b.push_back(&examples[j]);
    Tensor ids, targets;
    const int64_t n = make_sft_batch(b, m.config().vocab, ids, targets);
    total += m.loss(ids, targets).item() * double(n);
    counted += n;
  }
  return counted ? total / double(counted) : NAN;
}

std::string eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

}  // namespace

void FinetuneOptions::validate() const {
  TOY_CHECK(!model.empty(), "[finetune] -m/--model is required");
  TOY_CHECK(!data.empty(), "[finetune] --data is required");
  TOY_CHECK(!out.empty(), "[finetune] --out is required");
  TOY_CHECK(method == "full" || method == "lora", "[finetune] --method must be full or lora, got '{}'",
            printable(method));
  TOY_CHECK(!train_embeddings || method == "full", "[finetune] --train-embeddings applies to --method full");
  TOY_CHECK(lora_rank >= 1, "[finetune] --lora-rank must be at least 1");
  TOY_CHECK(std::isfinite(lora_alpha) && lora_alpha > 0, "[finetune] --lora-alpha must be positive");
  TOY_CHECK(lora_dropout >= 0 && lora_dropout < 1, "[finetune] --lora-dropout must be in [0, 1)");
  TOY_CHECK(batch >= 1 && accum >= 1, "[finetune] --batch and --accum must be at least 1");
  TOY_CHECK(steps >= 0, "[finetune] --steps must not be negative");
  TOY_CHECK(std::isfinite(epochs) && epochs > 0, "[finetune] --epochs must be positive");
  TOY_CHECK(std::isfinite(lr) && lr > 0, "[finetune] --lr must be positive");
  TOY_CHECK(std::isnan(min_lr) || (min_lr >= 0 && min_lr <= lr), "[finetune] --min-lr must be in [0, lr]");
  TOY_CHECK(warmup >= 0, "[finetune] --warmup must not be negative");
  TOY_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "[finetune] --wd must not be negative");
  TOY_CHECK(std::isfinite(clip) && clip >= 0, "[finetune] --clip must not be negative");
  TOY_CHECK(val_fraction >= 0 && val_fraction < 1, "[finetune] --val-fraction must be in [0, 1)");
  TOY_CHECK(precision == "f32" || precision == "bf16" || precision == "f16",
            "[finetune] --precision must be f32, bf16 or f16, got '{}'", printable(precision));
  TOY_CHECK(std::isfinite(loss_scale) && loss_scale >= 1, "[finetune] the loss scale must be at least 1");
  if (!merge_type.empty())
    TOY_CHECK(merge_type == "f32" || merge_type == "f16" || merge_type == "bf16" || merge_type == "q8_0",
              "[finetune] --merge-type must be f32, f16, bf16 or q8_0, got '{}'", printable(merge_type));
}

nlohmann::json FinetuneOptions::to_json() const {
  return {{"model", model},          {"data", data},
          {"out", out},              {"method", method},
          {"train_embeddings", train_embeddings},
          {"lora_rank", lora_rank},  {"lora_alpha", lora_alpha},
          {"lora_dropout", lora_dropout},
          {"lora_targets", lora_targets},
          {"ctx", ctx},              {"batch", batch},
          {"accum", accum},          {"pack", pack},
          {"recompute", recompute},  {"precision", precision},
          {"steps", steps},
          {"epochs", epochs},        {"lr", lr},
          {"min_lr", std::isnan(min_lr) ? lr / 10 : min_lr},
          {"warmup", warmup},        {"weight_decay", weight_decay},
          {"beta1", beta1},          {"beta2", beta2},
          {"clip", clip},            {"seed", seed},
          {"val_fraction", val_fraction},
          {"merge_type", merge_type}};
}

FinetuneResult finetune(const FinetuneOptions& o) {
  o.validate();
  check_new_run_folder(o.out, o.force);
  gguf::Reader reader(o.model);
  const bool full = o.method == "full";
  LoadedModel lm = load_model(reader, full ? LoadMode::Train : LoadMode::Infer);
  DecoderLM& m = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  std::optional<ChatTemplate> chat;
  try {
    chat = ChatTemplate::from_model(reader);
  } catch (const Error&) {
    // "messages" records will say the template is not one toy renders
  }

  const int64_t ctx = o.ctx ? o.ctx : std::min<int64_t>(m.config().ctx, 512);
  TOY_CHECK(ctx <= m.config().ctx, "[finetune] --ctx {} is longer than the model's context {}", ctx, m.config().ctx);
  SftData data = read_sft_data(o.data, tok, chat ? &*chat : nullptr, ctx);
  std::vector<SftExample> train, val;
  split_sft(std::move(data.examples), o.val_fraction, o.seed, train, val);
  TOY_CHECK(!train.empty(), "[finetune] no training examples are left after the validation split");
  if (!o.quiet && (data.truncated || data.dropped))
    std::fprintf(stderr, "toy finetune: warning: %lld records longer than --ctx %lld + 1 tokens were truncated%s\n",
                 (long long)data.truncated, (long long)ctx,
                 data.dropped ? fmt::format(" ({} left with nothing to learn were dropped)", data.dropped).c_str() : "");

  // What trains.
  if (full) {
    for (Param& p : m.params().all())
      if (p.trainable && is_embedding_like(p.name) && !o.train_embeddings) m.params().set_trainable(p.name, false);
  } else {
    LoraOptions lo;
    if (!o.lora_targets.empty()) lo.targets = parse_lora_targets(o.lora_targets);
    lo.rank = o.lora_rank, lo.alpha = o.lora_alpha, lo.dropout = o.lora_dropout, lo.seed = o.seed;
    add_lora(m, lo);
  }
  m.set_recompute(o.recompute);
  // Mixed precision: trainable projections multiply in BF16/F16 over their F32 masters; a
  // frozen F32 base (LoRA) is stored in that type outright (half the memory).
  const DType compute = o.precision == "bf16" ? DType::BF16 : o.precision == "f16" ? DType::F16 : DType::F32;
  if (compute != DType::F32) {
    NoGradGuard ng;
    for (auto& [name, lin] : m.projections()) {
      if (m.params().record(name).trainable)
        lin->compute = compute;
      else if (lin->weight.dtype() == DType::F32)
        lin->weight = m.params().replace(name, cast(lin->weight, compute));
    }
  }
  const std::string merge_type = o.merge_type.empty() ? default_merge_type(reader, m) : o.merge_type;
  // Steps from epochs: examples per step, or (packed) input tokens per step.
  double per_epoch = double(train.size()) / double(o.batch * o.accum);
  if (o.pack) {
    double inputs = 0;
    for (const SftExample& e : train) inputs += double(e.tokens.size() - 1);
    per_epoch = inputs / double(ctx * o.batch * o.accum);
  }
  const int64_t steps = o.steps ? o.steps : std::max<int64_t>(1, int64_t(std::ceil(o.epochs * per_epoch)));
  const float min_lr = std::isnan(o.min_lr) ? o.lr / 10 : o.min_lr;

  prepare_new_run_folder(o.out, o.force);
  const std::filesystem::path dir(o.out);
  EventLog events((dir / "events.jsonl").string(), false);
  nlohmann::json start = provenance();
  start["config"] = o.to_json();
  start["config"]["ctx"] = ctx;
  start["steps"] = steps;
  start["train_examples"] = train.size();
  start["val_examples"] = val.size();
  start["truncated"] = data.truncated;
  start["dropped"] = data.dropped;
  start["params"] = m.params().numel();
  start["trainable_params"] = m.params().trainable_numel();
  events.emit("run_start", start);
  if (!o.quiet)
    std::fprintf(stderr, "toy finetune: %s, %s of %lld parameters train; %zu examples (%zu validation), %lld steps\n",
                 full ? "full" : fmt::format("LoRA rank {}", o.lora_rank).c_str(),
                 fmt::format("{}", m.params().trainable_numel()).c_str(), (long long)m.params().numel(),
                 train.size() + val.size(), val.size(), (long long)steps);

  AdamW opt(m.params(), AdamWConfig{o.beta1, o.beta2, 1e-8f, o.weight_decay});
  Generator dropout_gen(o.seed, kDropoutStream);
  std::vector<size_t> order(train.size());
  int64_t epoch = -1;
  size_t cursor = order.size();
  auto next_example = [&]() -> const SftExample* {
    if (cursor == order.size()) {  // a new epoch: a fresh seeded order
      ++epoch;
      std::iota(order.begin(), order.end(), size_t(0));
      Generator g(o.seed, kShuffleStream + uint64_t(epoch));
      shuffle(order, g);
      cursor = 0;
    }
    return &train[order[cursor++]];
  };
  // Packed rows: examples in order until the next does not fit; it opens the next row.
  const SftExample* pending = nullptr;
  auto next_row = [&]() {
    std::vector<const SftExample*> row;
    int64_t used = 0;
    while (true) {
      const SftExample* e = pending ? pending : next_example();
      pending = nullptr;
      const int64_t n = int64_t(e->tokens.size()) - 1;
      if (used + n > ctx) {
        pending = e;
        return row;
      }
      row.push_back(e);
      used += n;
    }
  };

  FinetuneResult res;
  res.out = o.out;
  // A copy of the trainable weights at the best validation loss so far.
  std::vector<Tensor> best;
  auto note_validation = [&](int64_t step, double v) {
    if (!std::isfinite(v) || (res.best_step >= 0 && v >= res.best_val_loss)) return;
    NoGradGuard ng;
    size_t i = 0;
    for (Param& p : m.params().all()) {
      if (!p.trainable) continue;
      if (best.size() <= i) best.push_back(empty(p.value.shape(), p.value.dtype()));
      copy_(best[i++], p.value.detach());
    }
    res.best_step = step, res.best_val_loss = v;
  };
  res.trainable_params = m.params().trainable_numel();
  const auto t0 = Clock::now();
  double window_loss = 0;
  int64_t window_steps = 0, tokens = 0;
  // F16: dynamic loss scaling (a step whose gradient overflows is skipped and the scale
  // halved; after 200 good steps in a row it doubles).
  const bool scaled = compute == DType::F16;
  DynamicLossScale loss_scale(scaled ? o.loss_scale : 1.0f);
  for (int64_t step = 0; step < steps; ++step) {
    const float lr = cosine_lr(step, o.warmup, steps, o.lr, min_lr);
    double loss_sum = 0;
    for (int64_t micro = 0; micro < o.accum; ++micro) {
      Tensor ids, targets;
      Packing packing;
      if (o.pack) {
        std::vector<std::vector<const SftExample*>> rows;
        for (int64_t i = 0; i < o.batch; ++i) rows.push_back(next_row());
        make_packed_sft_batch(rows, ctx, m.config().vocab, ids, targets, packing.positions, packing.segments);
        for (const auto& row : rows)
          for (const SftExample* e : row) tokens += int64_t(e->tokens.size()) - 1;
      } else {
        std::vector<const SftExample*> b;
        for (int64_t i = 0; i < o.batch; ++i) b.push_back(next_example());
        make_sft_batch(b, m.config().vocab, ids, targets);
        for (const SftExample* e : b) tokens += int64_t(e->tokens.size()) - 1;
      }
      Tensor loss = m.loss(ids, targets, true, &dropout_gen, o.pack ? &packing : nullptr);
      const double l = loss.item();
      TOY_CHECK(std::isfinite(l), "[finetune] step {}: the loss became {} (try a lower --lr); nothing was written",
                step + 1, l);
      loss_sum += l;
      const float s = loss_scale.scale() / float(o.accum);
      backward(s == 1.0f ? loss : scale(loss, s));
    }
    if (scaled) {
      NoGradGuard ng;
      for (Param& p : m.params().all())
        if (p.value.grad().defined()) p.value.set_grad(scale(p.value.grad(), 1.0f / loss_scale.scale()));
    }
    const double norm = clip_grad_norm(m.params(), o.clip);
    if (scaled) {
      const float used = loss_scale.scale();
      if (!loss_scale.update(std::isfinite(norm))) {
        m.params().zero_grad();
        ++res.skipped_steps;
        events.emit("skipped_step", {{"step", step + 1}, {"loss_scale", used}, {"grad_norm", norm}});
        res.steps = step + 1;
        continue;
      }
    }
    TOY_CHECK(std::isfinite(norm), "[finetune] step {}: the gradient norm became {} (try a lower --lr or --clip)",
              step + 1, norm);
    opt.step(lr);
    m.params().zero_grad();
    const double loss = loss_sum / double(o.accum);
    window_loss += loss, ++window_steps;
    res.steps = step + 1;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool last = step + 1 == steps;
    if ((step + 1) % o.log_every == 0 || last) {
      res.train_loss = window_loss / double(window_steps);
      const double tps = double(tokens) / std::max(secs, 1e-9);
      events.emit("step", {{"step", step + 1}, {"loss", res.train_loss}, {"lr", lr}, {"grad_norm", norm},
                           {"tokens_per_s", tps}, {"epoch", epoch}});
      if (!o.quiet)
        std::fprintf(stderr, "step %6lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s\n", (long long)(step + 1),
                     (long long)steps, res.train_loss, lr, tps, eta(secs / double(step + 1) * double(steps - step - 1)).c_str());
      window_loss = 0, window_steps = 0;
    }
    if (o.eval_every && (step + 1) % o.eval_every == 0 && !last && !val.empty()) {
      const double v = mean_loss(m, val, o.batch);
      events.emit("eval", {{"step", step + 1}, {"val_loss", v}});
      if (!o.quiet) std::fprintf(stderr, "step %6lld  val loss %.4f\n", (long long)(step + 1), v);
      note_validation(step + 1, v);
    }
    if (stop_requested()) {
      res.stopped = true;
      break;
    }
  }
  if (window_steps) res.train_loss = window_loss / double(window_steps);
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.tokens_per_s = double(tokens) / std::max(res.seconds, 1e-9);
  if (!val.empty()) {
    res.val_loss = mean_loss(m, val, o.batch);
    events.emit("eval", {{"step", res.steps}, {"val_loss", res.val_loss}});
    note_validation(res.steps, res.val_loss);
  }
  // The best-model rule (as toy train's): the outputs hold the weights of the best
  // validation loss, which may be an earlier evaluation's.
  if (res.best_step >= 0 && res.best_step != res.steps) {
    NoGradGuard ng;
    size_t i = 0;
    for (Param& p : m.params().all())
      if (p.trainable) copy_(p.value, best[i++]);
    res.model = "best";
    if (!o.quiet)
      std::fprintf(stderr, "toy finetune: the outputs hold the best validation weights (step %lld, val loss %.4f)\n",
                   (long long)res.best_step, res.best_val_loss);
  }

  // The outputs: the adapter (LoRA), then the merged model.
  const std::string arch = lm.arch.empty() ? "toy" : lm.arch;
  if (!full) save_lora_adapter((dir / "adapter.gguf").string(), m, arch, o.lora_alpha);
  // (Merged straight into an F16/BF16 output type: the F32 sum exists one weight at a time.)
  merge_lora(m, merge_type == "f16" ? DType::F16 : merge_type == "bf16" ? DType::BF16 : DType::F32);
  ModelWriteOptions wo;
  wo.toy_config = reader.has("toy.config");
  if (const gguf::Value* t = reader.find("tokenizer.chat_template"); t && t->type == gguf::Type::STRING)
    wo.chat_template = t->s;
  wo.quant = &quant_kind(merge_type);
  gguf::Writer w;
  add_model_to_gguf(w, m, tok, "toy finetune", wo);
  w.write((dir / "model.gguf").string());
  events.emit("run_end", {{"steps", res.steps}, {"train_loss", res.train_loss}, {"val_loss", res.val_loss},
                          {"tokens_per_s", res.tokens_per_s}, {"seconds", res.seconds}, {"stopped", res.stopped},
                          {"skipped_steps", res.skipped_steps}, {"model", res.model}, {"best_step", res.best_step},
                          {"best_val_loss", res.best_val_loss}});
  return res;
}

}  // namespace toy
