#!/usr/bin/env bash
# Mutation check (a developer tool, not part of CI): each mutant below is a one-line bug — a
# sign, a scale, a layout, a missing check. Each is applied alone to a scratch copy of the
# tree, built incrementally, and the tests that should notice it are run. A mutant must be
# killed (some test fails); one that survives means a behaviour no test pins down.
#
#   scripts/mutants.sh [NAME...]     all mutants, or the named ones
#
# Prints one line per mutant, "MUTANT <name> killed|survived" ("invalid" when the change no
# longer applies exactly once or does not build: update the mutant), and exits non-zero if
# any survived or is invalid. The scratch copy lives in $TOY_MUTANTS_DIR (default
# /tmp/toy-mutants); its first build is a full one, later runs are incremental.
#
# TOY_MUTANTS_WHOLE=1 runs every mutant against the whole suite (every target built, every
# test run) instead of the tests its entry names: slower, and the honest check that a mutant
# is killed by some test, not only by the ones expected to catch it.
#
# Adding a mutant: `mutant NAME FILE TARGETS TEST_REGEX` then the original text and its
# replacement on the next two lines (exact text, "\n" for a line break); TARGETS are the
# build targets the tests need, TEST_REGEX selects them for ctest -R.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${TOY_MUTANTS_DIR:-/tmp/toy-mutants}
only=("$@")
export TOY_SHARED_DATA=${TOY_SHARED_DATA:-$root/../shared/data}

# ---- the mutants --------------------------------------------------------------------------------
# Each entry: name, file, targets, test regex, original, replacement (one field per line).
read -r -d '' MUTANTS <<'EOF'
rope-layout
src/toy/models/decoder_lm.cpp
toy_llamacpp_tests
^LlamaCpp\.RunsOurLlama
  o.neox = c.rope.neox;
  o.neox = true;
decay-every-parameter
src/toy/train/optimizer.cpp
toy_train_tests
^Train\.WeightDecay
ranges.push_back({b, e, p.decay});
ranges.push_back({b, e, true});
temperature-multiplied
src/toy/backend/cpu/sample.cpp
toy_train_tests toy_op_tests
^Sampler\.|^OpGrad\.sample_token
(z[size_t(idx[i])] - mx) / a.temperature
(z[size_t(idx[i])] - mx) * a.temperature
accumulation-unscaled
src/toy/train/loop.cpp
toy toy_train_tests toy_finetune_tests
^Train\.Accumulation|^FinetuneGaps\.
    const float k = loss_scale.scale() / float(s.accum);
    const float k = loss_scale.scale();
out-overwrites-a-run
src/toy/train/run_folder.cpp
toy toy_hostile_tests
^Hostile\.OutHolding
  TOY_CHECK(ours.empty() || force,
  TOY_CHECK(true,
out-accepts-foreign-files
src/toy/train/run_folder.cpp
toy toy_hostile_tests
^Hostile\.OutHolding
  TOY_CHECK(others.empty(),
  TOY_CHECK(true,
sigterm-not-handled
src/toy/cli/stop_signals.cpp
toy toy_hostile_tests
SIGTERM
for (int sig : {SIGINT, SIGTERM, SIGHUP})
for (int sig : {SIGINT, SIGHUP})
save-every-off-by-one
src/toy/train/loop.cpp
toy toy_hostile_tests
^Hostile\.SaveEvery
(o_.save_every > 0 && st_.step % o_.save_every == 0)
(o_.save_every > 0 && st_.step % o_.save_every == 1)
stale-temporary-kept
src/toy/train/trainer.cpp
toy toy_hostile_tests
^Hostile\.ALeftOver
for (const std::string& t : remove_stale_temporaries(dir))
for (const std::string& t : std::vector<std::string>{})
checkpoint-state-not-checked
src/toy/train/checkpoint.cpp
toy toy_hostile_tests
^Hostile\.ACheckpointWithNonFinite
  TOY_CHECK(bad < 0, "{} checkpoint '{}': tensor '{}' holds non-finite values
  TOY_CHECK(true, "{} checkpoint '{}': tensor '{}' holds non-finite values
checkpoint-version-ignored
src/toy/train/checkpoint.cpp
toy toy_hostile_tests
^Hostile\.ACheckpointOfAnotherFormat
ver->type == gguf::Type::U32 && ver->u == kCheckpointVersion,
ver->type == gguf::Type::U32,
checkpoint-negative-step
src/toy/train/checkpoint.cpp
toy toy_hostile_tests
^Hostile\.ACheckpointWithAStep
step >= 0 && step <= r.o.steps
step <= r.o.steps
nonfinite-loss-applied
src/toy/train/loop.cpp
toy toy_hostile_tests toy_train_tests
^Hostile\.ANonFiniteStep|^Loop\.
    if (!std::isfinite(l))\n      refuse(
    if (false)\n      refuse(
nonfinite-gradient-applied
src/toy/train/loop.cpp
toy_train_tests
^Train\.ANonFiniteGradient
if (!d.skipped && !std::isfinite(d.grad_norm)) refuse(
if (false) refuse(
corpus-change-ignored
src/toy/train/trainer.cpp
toy toy_hostile_tests
^Hostile\.AChangedCorpus
    if (r.corpus_hash != c.hash) {
    if (false) {
toy-threads-atoi
src/toy/core/thread_pool.cpp
toy toy_hostile_tests
^Hostile\.ToyThreads
  TOY_CHECK(parse_int64(env, n) && n >= 1
  TOY_CHECK((n = std::atoi(env), true) || n >= 1
thread-start-failure-uncaught
src/toy/core/thread_pool.cpp
toy toy_hostile_tests
^Hostile\.AThreadCount
    } catch (const std::system_error& e) {
    } catch (const std::range_error& e) {
fifo-read
src/toy/core/files.cpp
toy toy_hostile_tests
^Hostile\.Fifos
  if (!S_ISREG(st.st_mode)) {
  if (S_ISDIR(st.st_mode)) {
escape-sequences-echoed
src/toy/core/text.cpp
toy toy_hostile_tests
^Hostile\.ControlCharacters
    } else if (c < 0x20 || c == 0x7f) {
    } else if (c == 0) {
model-gguf-is-last
src/toy/train/trainer.cpp
toy toy_hostile_tests
^Hostile\.ModelGgufHoldsTheBest
        with_best([&] { save("model.gguf", "toy"); });
        save("model.gguf", "toy");
best-is-worst
src/toy/train/loop.cpp
toy toy_hostile_tests toy_train_tests
^Hostile\.ModelGgufHoldsTheBest|^Loop\.Best
if (has() && !(s < score || (s == score && t < tiebreak))) return false;
if (has() && !(s > score || (s == score && t < tiebreak))) return false;
memory-not-checked
src/toy/train/memory.cpp
toy toy_hostile_tests
^Hostile\.BadValues
  TOY_CHECK(need.total() <= double(available),
  TOY_CHECK(true,
token-cache-count-trusted
src/toy/data/batches.cpp
toy toy_hostile_tests
^Hostile\.ATokenCache
k == key && n == (size - kHeaderBytes) / 4 && (size - kHeaderBytes) % 4 == 0 && n <= max_tokens;
k == key;
config-shapes-after-allocation
src/toy/io/model_file.cpp
toy toy_hostile_tests
^Hostile\.AModelConfigClaiming
    TOY_CHECK(ti->shape == shape,
    TOY_CHECK(true,
json-fraction-truncated
src/toy/core/json_fields.cpp
toy toy_hostile_tests
^Hostile\.AFractional
  if (v.is_number_integer()) {
  if (v.is_number()) {
usage-error-exit-1
src/toy/cli/main.cpp
toy toy_hostile_tests
^Hostile\.EveryError
    return report(e.what(), kExitUsage,
    return report(e.what(), kExitRuntime,
flag-range-unchecked
src/toy/cli/flags.cpp
toy toy_hostile_tests
^Hostile\.ZeroAndNonsense
  if (!parse_int64(s, v) || v < lo || v > hi) bad(
  if (!parse_int64(s, v)) bad(
flag-trailing-text
src/toy/core/text.cpp
toy toy_hostile_tests
^Hostile\.(ToyThreads|ZeroAndNonsense)
  auto r = std::from_chars(b, s.data() + s.size(), out, 10);\n  return r.ec == std::errc() && r.ptr == s.data() + s.size();\n}\n\nbool parse_uint64
  auto r = std::from_chars(b, s.data() + s.size(), out, 10);\n  return r.ec == std::errc();\n}\n\nbool parse_uint64
resume-refuses-same-flags
src/toy/cli/cmd_train.cpp
toy toy_hostile_tests
^Hostile\.ResumeAccepts
    TOY_CHECK(was == now, "[train] {} cannot change
    TOY_CHECK(false, "[train] {} cannot change
resume-accepts-other-flags
src/toy/cli/cmd_train.cpp
toy toy_hostile_tests
^Hostile\.ResumeAccepts
    TOY_CHECK(was == now, "[train] {} cannot change
    TOY_CHECK(true, "[train] {} cannot change
q4k-weights
src/toy/core/quant.cpp
toy_core_tests
^BlockCodec\.MatchesGgml
    const float av_x = std::sqrt(sum_x2 / 32);
    const float av_x = std::sqrt(sum_x2 / 16);
q6k-scale-sign
src/toy/core/quant.cpp
toy_core_tests
^BlockCodec\.MatchesGgml
  const float iscale = -128.0f / max_scale;
  const float iscale = 128.0f / max_scale;
rope-neox-ignored
src/toy/models/decoder_lm.cpp
toy_llamacpp_tests
^LlamaCpp\.RunsQwen2
  o.neox = c.rope.neox;
  o.neox = false;
qk-norm-skipped
src/toy/nn/attention.cpp
toy_llamacpp_tests
^LlamaCpp\.RunsQwen2
  if (q_norm.defined()) h.q = q_norm(h.q);
  if (false) h.q = q_norm(h.q);
kv-cache-overwrites-the-start
src/toy/nn/attention.cpp
toy_model_tests
^Decoder\.IncrementalDecoding
  const int64_t start = cache.size(), T = k.size(1);
  const int64_t start = 0, T = k.size(1);
stored-weight-tile-offset
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^Forward\.LinearWithStoredWeights
                  int(in), accumulate ? 1.0f : 0.0f, yp + r0, int(out));
                  int(in), accumulate ? 1.0f : 0.0f, yp, int(out));
gemv-q5_0-fifth-bit
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath
    const __m256i clear = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    const __m256i clear = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(8));
quant-evex-q5_0-fifth-bit-inverted
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^QuantGaps\.
    return _mm256_mask_add_epi8(base, __mmask32(qh), base, _mm256_set1_epi8(16));
    return _mm256_mask_add_epi8(base, __mmask32(~qh), base, _mm256_set1_epi8(16));
quant-evex-q4_0-offset
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^QuantGaps\.
    return _mm256_add_epi8(unpack_nibbles(b + 2), _mm256_set1_epi8(120));
    return _mm256_add_epi8(unpack_nibbles(b + 2), _mm256_set1_epi8(-128));
gemv-q6_k-offset
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath|^Forward\.KQuant
      const __m256i thirty_twos = _mm256_slli_epi32(_mm256_madd_epi16(sums16, sc16), 5);
      const __m256i thirty_twos = _mm256_slli_epi32(_mm256_madd_epi16(sums16, sc16), 4);
gemv-q4_k-high-scale-bits
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath|^Forward\.KQuant
    u[1] = (p[2] & 0x0f0f0f0f) | (((p[0] >> 6) & 0x03030303) << 4);
    u[1] = (p[2] & 0x0f0f0f0f) | (((p[0] >> 6) & 0x03030303) << 3);
gemv-q4_k-d-an-ulp-off
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.KQuant
      const float d = xd * dw, dmin = -xd * dmw;
      const float d = std::nextafter(xd * dw, 0.0f), dmin = -xd * dmw;
kquant-q5_k-fifth-bit-of-the-wrong-sub-block
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath|^Forward\.KQuant
      const __m256i fifth1 = _mm256_and_si256(hbits, _mm256_set1_epi8(char(2 << (2 * j))));
      const __m256i fifth1 = _mm256_and_si256(hbits, _mm256_set1_epi8(char(1 << (2 * j))));
kquant-q5_k-mins-unscaled
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.KQuant
      summs[i] = std::fma(dmin, float(_mm_cvtsi128_si32(total)), summs[i]);
      summs[i] = summs[i] + dmin * float(_mm_cvtsi128_si32(total)) * 1.0000001f;
kquant-q3_k-fours-halved
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath|^Forward\.KQuant
        fours[bit] = _mm256_slli_epi16(_mm256_srli_epi16(clear, bit), 2);
        fours[bit] = _mm256_slli_epi16(_mm256_srli_epi16(clear, bit), 1);
kquant-q3_k-high-scale-bits-shifted
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.LinearDecodePath|^Forward\.KQuant
    u[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((a[2] >> 4) & 0x03030303) << 4);
    u[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((a[2] >> 6) & 0x03030303) << 4);
kquant-q2_k-dmin-an-ulp-off
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.KQuant
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-xd * dmw), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, sums16)), acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-xd * dmw * 1.0000001f), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, sums16)), acc[i]);
kquant-tile-scale-of-the-first-row
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.KQuant
      const float xd = x[i].d[sb * 8];
      const float xd = x[0].d[sb * 8];
kquant-q6-tile-values-of-the-first-row
src/toy/backend/cpu/kquant_products.cpp
toy_op_tests
^Forward\.KQuant
          p[r] = _mm256_madd_epi16(s[4 * h + r], _mm256_maddubs_epi16(v[4 * h + r], load32(xq + 128 * h + 32 * r)));
          p[r] = _mm256_madd_epi16(s[4 * h + r], _mm256_maddubs_epi16(v[4 * h + r], load32(x[0].q + sb * 256 + 128 * h + 32 * r)));
q5_k-decode-fifth-bit
src/toy/core/quant.cpp
toy_core_tests
^BlockCodec\.MatchesGgml
    for (int l = 0; l < 32; ++l) y[64 * c + l] = d1 * float((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - n1;
    for (int l = 0; l < 32; ++l) y[64 * c + l] = d1 * float((ql[l] & 0xf) + ((qh[l] & u2) ? 16 : 0)) - n1;
quantize-more-bits-layers
src/toy/io/quantize.cpp
toy toy_llamacpp_tests
^LlamaCpp\.QuantizesTensorForTensor
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 1; }
quantize-q4_k-fallback
src/toy/io/quantize.cpp
toy toy_cli_tests
^CliInit\.SmolLM2
    case DType::Q4_K: r = DType::Q5_0; break;
    case DType::Q4_K: r = DType::Q4_0; break;
perplexity-scores-the-second-half
src/toy/cli/cmd_perplexity.cpp
toy toy_cli_tests
^CliPerplexity\.
    const int64_t first = N / 2, V = m.config().vocab;
    const int64_t first = N / 4, V = m.config().vocab;
llama3-template-untrimmed
src/toy/infer/chat.cpp
toy_cli_tests
^Chat\.Recognises
+ trim(m.content) +
+ m.content +
gguf-overlapping-tensors
src/toy/io/gguf.cpp
toy toy_hostile_tests
^HostileModel\.Overlapping
    TOY_CHECK(a.offset + a.bytes <= b.offset || a.bytes == 0 || b.bytes == 0,
    TOY_CHECK(a.offset <= b.offset || a.bytes == 0 || b.bytes == 0,
one-query-attention-unscaled
src/toy/backend/cpu/attention.cpp
toy_op_tests
^Forward\.AttentionCausal
      s[j] = (hsum256(a0) + dot_tail(k0)) * g.scale;
      s[j] = (hsum256(a0) + dot_tail(k0));
history-grows-per-token
src/toy/infer/generate.cpp
toy_train_tests
^Generate\.AllocatesNothing
  history.reserve(history.size() + size_t(std::min<int64_t>(n, int64_t(1) << 20)) + 1);  // no growth per token
  history.reserve(history.size() + 1);
pool-never-reuses
src/toy/core/small_object_pool.cpp
toy_train_tests
^Train\.(Steps|Quantized)
    if (FreeBlock* b = p.free[c]) {
    if (FreeBlock* b = nullptr) {
depth-cache-read-off-by-one
src/toy/cli/bench_run.cpp
toy toy_cli_tests
^CliBench\.RunTimesGeneration
      const double kv_ms = kv_bytes_per_position * double(d) / (bw * 1e9) * 1e3;  // the cache d adds
      const double kv_ms = kv_bytes_per_position * double(d + 1) / (bw * 1e9) * 1e3;  // the cache d adds
q8-scale-not-f16
src/toy/backend/cpu/gemv_blocks.cpp
toy_op_tests
^Forward\.Activations
  return std::isfinite(scale) ? round_to_f16(scale) : scale;
  return scale;
f16-activations-unrounded
src/toy/backend/cpu/gemv_blocks.cpp
toy_op_tests
^Forward\.LinearDecodePath
  if (weight == DType::F16) return round_row_to_f16(x, K, out);
  if (weight == DType::F16) return (void)std::copy(x, x + K, out);
prompt-activations-unrounded
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^Forward\.LinearWith
  if (rounds_activations(w.dtype())) {
  if (false) {
lora-b-not-zero
src/toy/models/lora.cpp
toy_finetune_tests
^Lora\.AtStepZero
    lin->lora.b = m.params().add(name + ".lora_b", zeros(Shape{out, o.rank}), true);
    lin->lora.b = m.params().add(name + ".lora_b", full(Shape{out, o.rank}, 0.01), true);
lora-scale-ignores-rank
src/toy/models/lora.cpp
toy_finetune_tests
^Lora\.(LoadsAn|AdapterFiles)
    lin.lora.scale = alpha != 0.0f ? user_scale * alpha / float(rank) : user_scale;
    lin.lora.scale = alpha != 0.0f ? user_scale * alpha : user_scale;
sft-prompt-counted
src/toy/data/sft.cpp
toy_finetune_tests
^Sft\.PromptCompletion
  for (int32_t id : p) append_id(e, id, false);
  for (int32_t id : p) append_id(e, id, true);
packed-positions-continue
src/toy/data/sft.cpp
toy_finetune_tests
^Sft\.PackedRows
        pp[k] = int32_t(i);
        pp[k] = int32_t(at + i);
recompute-new-dropout-masks
src/toy/models/decoder_lm.cpp
toy_finetune_tests
^Recompute\.
          if (g && !*first) again = **replay, draw = &again;
          (void)replay;
gradientless-parameters-move
src/toy/train/optimizer.cpp
toy_train_tests
^ParamArena\.
if (p.arena_offset < 0 || !p.value.grad().defined()) continue;
if (p.arena_offset < 0) continue;
loss-scale-never-halves
src/toy/train/optimizer.cpp
toy_finetune_tests
^MixedPrecision\.DynamicLossScale
    scale_ = std::max(1.0f, scale_ / 2);
    scale_ = std::max(1.0f, scale_);
mixed-precision-grad-unrounded
src/toy/ops/matmul.cpp
toy_finetune_tests
^MixedPrecision\.Gradient
      if (wants_grad(w)) r[1] = matmul_nd(t_view(g), cast(cast(x2, w.dtype()), DType::F32));  // [out, in]
      if (wants_grad(w)) r[1] = matmul_nd(t_view(g), x2);  // [out, in]
finetune-best-not-restored
src/toy/train/finetune.cpp
toy_finetune_tests
^FinetuneBest\.
      r_.loop.best.swap_with(r_.model->params());
      (void)0;
micro-batches-share-windows
src/toy/train/step.cpp
toy_train_tests
^Train\.
Generator data = data_gen_.for_micro_batch(mb.step, mb.index);
Generator data = data_gen_.for_micro_batch(mb.step, 0);
finetune-resume-pending-row-lost
src/toy/train/finetune_checkpoint.cpp
toy_finetune_tests
^FinetuneResume\.Lora
  r.pending = get_bool(st, "pending", w);
  r.pending = false;
finetune-resume-best-lost
src/toy/train/finetune_checkpoint.cpp
toy_finetune_tests
^FinetuneResume\.Lora
  loop.best.load(rd, r.model->params(), best_step, get_double(st, "best_val_loss", w), 0, "[finetune]");
  (void)best_step;
finetune-resume-loss-scale-lost
src/toy/train/finetune_checkpoint.cpp
toy_finetune_tests
^FinetuneResume\.Full
  loop.loss_scale.restore(scale, good);
  (void)good;
finetune-resume-data-unchecked
src/toy/train/finetune.cpp
toy_finetune_tests
^FinetuneResume\.Refuses
  check_same_file(data, r.data_id, "training data");
  (void)data;
lens-not-folded
src/toy/train/finetune_model.cpp
toy_finetune_tests
^Lens\.Finetune
  m.fold_lens();
  (void)m;
lens-fold-drops-the-last-row
src/toy/models/decoder_lm.cpp
toy_finetune_tests
^Lens\.Folding
    const int64_t n = std::min(kRows, V - r0);
    const int64_t n = std::min(kRows, V - r0 - 1);
lora-base-trains
src/toy/train/finetune_model.cpp
toy_finetune_tests
^Lens\.Finetune
    if (!full) return false;
    if (!full) return true;
gdn-head-repeat-grouped
src/toy/backend/cpu/gated_delta.cpp
toy_op_tests
^Forward\.GatedDeltaRule
  const int64_t hk = hv % d.Hk;
  const int64_t hk = hv / (d.Hv / d.Hk);
gdn-chunk-state-not-decayed
src/toy/backend/cpu/gated_delta.cpp
toy_op_tests
^Forward\.GatedDeltaRule
              std::exp(last), S, int(Dv));
              1.0f, S, int(Dv));
gdn-backward-dq-state-term
src/toy/backend/cpu/gated_delta.cpp
toy_op_tests
^OpGrad\.gated_delta_rule
          for (int64_t r = 0; r < Dk; ++r) dqt[r] += kt[r] * u_do;
          (void)u_do;
gdn-q-unscaled
src/toy/backend/cpu/gated_delta.cpp
toy_model_tests
HfFixture
          const float m = part ? inv : inv * q_scale;
          const float m = inv;
gdn-conv-tail-kept
src/toy/nn/gated_delta_net.cpp
toy_model_tests
^Decoder\.HybridPrefill
      copy_(tail, last);
      (void)last;
gated-attention-ungated
src/toy/nn/attention.cpp
toy_model_tests
HfFixture
  return out(gated ? mul(flat, sigmoid(gate)) : flat);
  return out(flat);
qwen35-attention-interval
src/toy/models/config.cpp
toy_model_tests
HfFixture
    kinds.push_back((l + 1) % interval == 0 ? LayerKind::Attention : LayerKind::GatedDeltaNet);
    kinds.push_back(l % interval == 0 ? LayerKind::Attention : LayerKind::GatedDeltaNet);
softplus-threshold
src/toy/backend/cpu/elementwise.cpp
toy_op_tests
^Torch\.softplus
      return scalar8(x, [](float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); });
      return scalar8(x, [](float v) { return v > 2.0f ? v : std::log1p(std::exp(v)); });
depth-scale-not-folded
src/toy/io/model_file.cpp
toy_model_tests
^Decoder\.DepthScale
  if (fold) c.depth_scale = false;
  (void)fold;
qwen35-mtp-run
src/toy/io/model_file.cpp
toy_model_tests
^Qwen35Files\.
    c.layers = all_layers - nextn;
    c.layers = all_layers;
vit-attention-causal
src/toy/models/vit.cpp
toy_vision_tests
^Vit\.MatchesPyTorch
    blk.attn.causal = false;  // every patch sees every other
    blk.attn.causal = true;
vit-gelu-tanh
src/toy/models/vit.cpp
toy_vision_tests
^Vit\.MatchesPyTorch
    blk.mlp.gelu_approx = GeluApprox::None;
    blk.mlp.gelu_approx = GeluApprox::Tanh;
label-smoothing-sign
src/toy/models/vit.cpp
toy_vision_tests
^Vit\.MatchesPyTorch
  Tensor uniform = neg(mean(log_softmax(logits)));
  Tensor uniform = mean(log_softmax(logits));
vision-resume-drops-epoch-loss
src/toy/train/vision.cpp
toy_vision_tests
^VisionTrain\.StoppedAndResumed
  r.epoch_loss = get_double(st, "epoch_loss", where);
  r.epoch_loss = 0;
vision-augmentation-default-ignored
src/toy/train/vision.cpp
toy_vision_tests
^VisionTrain\.AugmentationDefaults
  if (!r.o.flip) r.o.flip = aug.flip;
  if (!r.o.flip) r.o.flip = false;
csv-pixel-scale
src/toy/data/images.cpp
toy_vision_tests
^Images\.ReadsCsv
  const double full = vmax <= 1 ? 1 : vmax <= 16 ? 16 : 255;
  const double full = 255;
idx-label-count
src/toy/data/images.cpp
toy_vision_tests
^Images\.BadIdx
  TOY_CHECK(di[0] == dl[0],
  TOY_CHECK(true,
toy-cpu-avx2-ignored
src/toy/core/cpu_features.cpp
toy_cli_tests
^CliBench\.KernelVariant
  if (v == "avx2") return {KernelVariant::Avx2, true};
  if (v == "avx2") return {has512 ? KernelVariant::Avx512 : KernelVariant::Avx2, true};
quant-512-tile-skips-the-last-block
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^QuantGaps\.BlockProducts
  for (int64_t b = 0; b < nb; ++b) {\n    __m512i u[RW];
  for (int64_t b = 0; b + 1 < nb; ++b) {\n    __m512i u[RW];
step-positions-from-zero
src/toy/models/decoder_lm.cpp
toy_serve_tests
^ServeEngine\.DecodeStep
    positions.data<int32_t>()[i] = int32_t(c.size());
    positions.data<int32_t>()[i] = 0;
step-attends-first-row
src/toy/nn/attention.cpp
toy_serve_tests
^ServeEngine\.DecodeStep
    rows.push_back(attention(slice(h.q, 0, i, i + 1), kh, vh, ao));
    rows.push_back(attention(slice(h.q, 0, 0, 1), kh, vh, ao));
prefix-fed-twice
src/toy/serve/engine.cpp
toy_serve_tests
^ServeEngine\.ContinuesACachedPrefix
    chunks.push_back(std::span<const int32_t>(s->job->params.prompt).subspan(s->cached.size(), size_t(n)));
    chunks.push_back(std::span<const int32_t>(s->job->params.prompt).subspan(s->cached.size() / 2, size_t(n)));
queue-limit-off-by-one
src/toy/serve/engine.cpp
toy_serve_tests
^ServeEngine\.CancelFrees
    if (active_.load() + int64_t(queue_.size()) >= int64_t(slots_.size()) + o_.queue) return nullptr;
    if (active_.load() + int64_t(queue_.size()) > int64_t(slots_.size()) + o_.queue) return nullptr;
cancel-ignored
src/toy/serve/engine.cpp
toy_serve_tests
^ServeEngine\.CancelFrees
  if (job.cancelled()) return release(s, "cancelled");
  if (false) return release(s, "cancelled");
api-key-not-checked
src/toy/serve/server.cpp
toy_serve_tests
^ServeHttp\.Errors
    if (o_.api_key.empty()) return true;
    return true;
usage-chunk-dropped
src/toy/serve/server.cpp
toy_serve_tests
^ServeHttp\.Endpoints
              if (include_usage) {
              if (false) {
vnni-start-sums
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^Forward\.Q8_0ProductsWithVnni
_mm256_slli_epi32(sums, 7)
_mm256_slli_epi32(sums, 6)
pool-caller-only-waits
src/toy/core/thread_pool.cpp
toy_core_tests
^ThreadPool\.
    work_on(gen);\n    t_in_parallel = false;
    t_in_parallel = false;
chat-page-shows-last-piece
src/toy/serve/chat.html
toy toy_serve_client_tests
^ServeClients\.TheChatPage
            out.textContent = reply;
            out.textContent = delta.content;
lora-merge-fresh-head
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneMerge\.
(lens && name == "output.weight" && !reuse_head)
(name == "output.weight" && !reuse_head)
merge-drops-tokenizer-keys
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneMerge\.
if (key.rfind("tokenizer.", 0) == 0 && !w.has(key)) w.set(key, value);
if (false) w.set(key, value);
bpe-add-bos-left-out
src/toy/tokenizer/bpe.cpp
toy_tokenizer_tests
^TokenizerGguf\.
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos_));
    if (add_bos_ != pre_->adds_bos()) w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos_));
stopped-finetune-exits-0
src/toy/cli/cmd_finetune.cpp
toy toy_cli_tests
^CliFinetune\.CtrlC
return r.stopped ? stop_signal_exit_code() : 0;
return 0;
stopped-vision-exits-0
src/toy/cli/cmd_vision.cpp
toy toy_vision_tests
^VisionTrain\.CtrlC
return r.stopped ? stop_signal_exit_code() : 0;
return 0;
gguf-tmp-not-pending
src/toy/io/gguf.cpp
toy_core_tests
^PendingFiles\.
  const PendingFile pending(tmp);
  (void)0;
force-replaces-users-model
src/toy/train/run_folder.cpp
toy toy_hostile_tests
^Hostile\.ForceDoesNotReplace
  if (!holds("events.jsonl") && !holds("checkpoint.gguf")) {
  if (false) {
classify-stops-at-a-bad-file
src/toy/cli/cmd_vision.cpp
toy toy_vision_tests
^VisionTrain\.CliTrains
        errors[i] = e.what();
        throw;
classify-ranks-ascending
src/toy/cli/cmd_vision.cpp
toy toy_vision_tests
^VisionTrain\.CliTrains
[&](int64_t a, int64_t b) { return p[a] > p[b]; }
[&](int64_t a, int64_t b) { return p[a] < p[b]; }
png-checksum-unchecked
src/toy/data/images.cpp
toy_vision_tests
^Images\.EmptyDamaged
TOY_CHECK(uint32_t(got) == want,
TOY_CHECK(true,
eval-classes-by-position
src/toy/train/vision.cpp
toy toy_vision_tests
^VisionTrain\.CliTrains
  for (int32_t& l : s.labels) l = to_model[size_t(l)];
  (void)to_model;
labels-mostly-not-classes
src/toy/train/vision.cpp
toy_vision_tests
^Images\.TrainingLabels
  TOY_CHECK(2 * empty <= K,
  TOY_CHECK(true,
lora-defaults-per-head
src/toy/models/lora.cpp
toy toy_finetune_tests
^Lora\.DefaultTargetsOfAHybrid
    if (kind != "ssm_alpha" && kind != "ssm_beta") out.push_back(kind);
    out.push_back(kind);
stop-filter-first-string-only
src/toy/infer/stop_filter.h
toy_train_tests
^StopFilter\.
      if (!s.empty()) cut = std::min(cut, pending_.find(s));
      if (!s.empty() && &s == &stop_[0]) cut = std::min(cut, pending_.find(s));
pool-caller-waits-for-workers
src/toy/core/thread_pool.cpp
toy_core_tests
^ThreadPool\.AJobNeverWaits
    work_on(gen);\n    t_in_parallel = false;
    t_in_parallel = false;
serve-head-uncapped
src/toy/serve/connection.cpp
toy toy_serve_tests
^ServeHttp\.SmugglingHugeHeaders
    if (head_ > kMaxHead) {
    if (false) {
serve-no-request-deadline
src/toy/serve/connection.cpp
toy toy_serve_tests
^ServeRobustness\.ARequestHasOneDeadline
    if (now >= deadline_ || !wait_socket(c_.sock, POLLIN, std::min(idle_, deadline_ - now))) {
    if (!wait_socket(c_.sock, POLLIN, idle_)) {
serve-fixed-thread-pool
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeRobustness\.SlowClients
return new ElasticPool(threads);
return new httplib::ThreadPool(81);
serve-departed-client-keeps-its-slot
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeRobustness\.AClientThatLeaves
          if (!ended && conn && conn->sock >= 0 && !job->cancelled() && peer_gone(conn->sock)) job->cancel();
          (void)conn;
serve-max-tokens-uncapped
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeHttp\.MaxTokensBeyond
        if (room > 0 && cr.max_tokens > room)
        if (false)
serve-http10-chunked
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeHttp\.Http10
      if (req.version == "HTTP/1.0") {
      if (false) {
serve-length-and-chunked-accepted
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeHttp\.SmugglingHugeHeaders
    if ((chunked && length) || req.get_header_value_count("Content-Length") > 1) {
    if (false) {
serve-bearer-case-sensitive
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeHttp\.SmugglingHugeHeaders
strncasecmp(header.c_str(), "bearer ", 7) == 0
strncmp(header.c_str(), "Bearer ", 7) == 0
serve-internal-prefix-in-messages
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeHttp\.SmugglingHugeHeaders
    m.remove_prefix(end + 2);
    (void)end;
serve-seed-minus-one-fixed
src/toy/serve/openai.cpp
toy_serve_tests
^ServeOpenAI\.SeedMinusOne
      if (seed != -1) r.seed = uint64_t(seed);
      r.seed = uint64_t(seed);
serve-seed-ignored
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeSampling\.
        p.seed = cr.seed ? *cr.seed : random_seed();
        p.seed = random_seed();
serve-slot-sampler-seed-constant
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
  s.sampler.emplace(job.params.sampling, job.params.seed);
  s.sampler.emplace(job.params.sampling, 0);
serve-top-p-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "top_p")) s.top_p = float(number(j, "top_p", 0, 1));
  if (false) s.top_p = float(number(j, "top_p", 0, 1));
serve-top-p-zero-refused
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (s.top_p == 0) s.top_p = 1e-6f;
  if (false) s.top_p = 1e-6f;
serve-top-k-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "top_k")) s.top_k = int(integer(j, "top_k", 0, std::numeric_limits<int32_t>::max()));
  if (false) s.top_k = int(integer(j, "top_k", 0, std::numeric_limits<int32_t>::max()));
serve-min-p-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "min_p")) s.min_p = float(number(j, "min_p", 0, 1));
  if (false) s.min_p = float(number(j, "min_p", 0, 1));
serve-repeat-penalty-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "repeat_penalty")) s.repeat_penalty = float(number(j, "repeat_penalty", 0.01, 100));
  if (false) s.repeat_penalty = float(number(j, "repeat_penalty", 0.01, 100));
serve-presence-penalty-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "presence_penalty")) s.presence_penalty = float(number(j, "presence_penalty", -2, 2));
  if (false) s.presence_penalty = float(number(j, "presence_penalty", -2, 2));
serve-frequency-penalty-ignored
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeSampling\.
  if (field(j, "frequency_penalty")) s.frequency_penalty = float(number(j, "frequency_penalty", -2, 2));
  if (false) s.frequency_penalty = float(number(j, "frequency_penalty", -2, 2));
serve-generated-not-penalised
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
  s.history.push_back(id);
  (void)id;
serve-prompt-not-penalised
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
  s.history = prompt;
  s.history.clear();
serve-cached-tokens-not-reported
src/toy/serve/server.cpp
toy toy_serve_tests
^ServeSampling\.
{"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
{"prompt_tokens_details", {{"cached_tokens", 0}}}};
serve-cached-tokens-not-counted
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
  job.cached_tokens = int64_t(s.cached.size());
  job.cached_tokens = 0;
serve-cached-prefix-slot-not-preferred
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
    const size_t len = prefix ? n : 0;
    const size_t len = prefix ? 0 : 0;
serve-prefix-not-compared
src/toy/serve/engine.cpp
toy toy_serve_tests
^ServeSampling\.
  const bool prefix = n > 0 && n < prompt.size() && std::equal(s.cached.begin(), s.cached.end(), prompt.begin());
  const bool prefix = n > 0 && n < prompt.size();
eval-lora-not-applied
src/toy/cli/cmd_eval.cpp
toy toy_finetune_tests
^FinetuneGaps\.
apply_lora_flags(f.lora, lm);
(void)f.lora;
generate-lora-not-applied
src/toy/cli/cmd_generate.cpp
toy toy_finetune_tests
^FinetuneGaps\.
apply_lora_flags(f.lora, lm);
(void)f.lora;
pack-fit-off-by-one
src/toy/train/finetune.cpp
toy toy_finetune_tests
^FinetuneGaps\.
if (used + n > r.o.ctx) {
if (used + n >= r.o.ctx) {
pack-pending-record-lost
src/toy/train/finetune.cpp
toy toy_finetune_tests
^FinetuneGaps\.
const SftExample* e = r.pending ? &r.train[r.order[r.cursor - 1]] : next_example(r);
const SftExample* e = next_example(r);
truncation-keeps-the-end
src/toy/data/sft.cpp
toy toy_finetune_tests
^FinetuneGaps\.
e.tokens.resize(size_t(ctx + 1));
e.tokens.erase(e.tokens.begin(), e.tokens.end() - (ctx + 1));
truncation-mask-shorter
src/toy/data/sft.cpp
toy toy_finetune_tests
^FinetuneGaps\.
e.trained.resize(size_t(ctx + 1));
e.trained.resize(size_t(ctx));
truncation-counts-exact-fit
src/toy/data/sft.cpp
toy toy_finetune_tests
^FinetuneGaps\.
if (int64_t(e.tokens.size()) > ctx + 1) {
if (int64_t(e.tokens.size()) >= ctx + 1) {
mixed-precision-silently-f32
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneGaps\.
const DType compute = o.precision == "bf16" ? DType::BF16 : o.precision == "f16" ? DType::F16 : DType::F32;
const DType compute = DType::F32;
full-mixed-precision-not-rounded
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneGaps\.
lin->compute = compute;
lin->compute = DType::F32;
f16-overflow-not-skipped
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
!loss_scale.update(std::isfinite(d.grad_norm))
!loss_scale.update(true)
f16-skipped-step-applied
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
  if (!d.skipped) {
  if (true) {
f16-gradient-not-unscaled
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
if (s.dynamic_loss_scale) scale_grads(params, 1.0f / loss_scale.scale());
if (s.dynamic_loss_scale) scale_grads(params, 1.0f);
accum-one-micro-batch
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
for (int64_t micro = 0; micro < s.accum; ++micro) {\n    Tensor loss = task.micro_loss(MicroBatch{s.step, micro, s.accum, &device_step}, d.units);
for (int64_t micro = 0; micro < 1; ++micro) {\n    Tensor loss = task.micro_loss(MicroBatch{s.step, micro, s.accum, &device_step}, d.units);
lora-no-alpha-means-one
src/toy/models/lora.cpp
toy toy_finetune_tests
^FinetuneGaps\.
r.get_f32("adapter.lora.alpha") : 0.0f;
r.get_f32("adapter.lora.alpha") : 1.0f;
lora-targets-ignored
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneGaps\.
if (!o.lora_targets.empty()) lo.targets
if (false) lo.targets
train-embeddings-ignored
src/toy/train/finetune_model.cpp
toy toy_finetune_tests
^FinetuneGaps\.
return !is_embedding_like(name) || o.train_embeddings;
return !is_embedding_like(name);
epochs-steps-floor
src/toy/train/finetune.cpp
toy toy_finetune_tests
^FinetuneGaps\.
int64_t(std::ceil(opts.epochs * per_epoch))
int64_t(opts.epochs * per_epoch)
epochs-ignore-accum
src/toy/train/finetune.cpp
toy toy_finetune_tests
^FinetuneGaps\.
double per_epoch = double(r.train.size()) / double(opts.batch * opts.accum);
double per_epoch = double(r.train.size()) / double(opts.batch);
lr-schedule-off-by-one
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
const float lr = cosine_lr(st_.step, schedule);
const float lr = cosine_lr(st_.step + 1, schedule);
min-lr-default-wrong
src/toy/train/finetune.cpp
toy toy_finetune_tests
^FinetuneGaps\.
r.o.min_lr = opts.lr / 10;
r.o.min_lr = opts.lr / 100;
warmup-reaches-peak-late
src/toy/core/lr_schedule.h
toy toy_finetune_tests
^FinetuneGaps\.
if (step < warmup) return lr * float(step + 1) / float(warmup + 1);
if (step < warmup) return lr * float(step) / float(warmup);
final-best-not-checkpointed
src/toy/train/loop.cpp
toy toy_finetune_tests
^FinetuneGaps\.
if (!stopped && task_.final_evaluation()) checkpoint("best");
if (!stopped && task_.final_evaluation() && false) checkpoint("best");
evaluate-labels-of-first-batch
src/toy/train/vision.cpp
toy_vision_tests
^VisionGaps\.EvaluateMatches
std::vector<int32_t> ids(s.labels.begin() + at, s.labels.begin() + at + n);
std::vector<int32_t> ids(s.labels.begin(), s.labels.begin() + n);
augment-flips-without-flip
src/toy/train/vision.cpp
toy_vision_tests
^VisionGaps\.TrainingStepsSee
const bool flip = may_flip && (b[2] & 1);
const bool flip = (b[2] & 1) != 0;
augment-shift-beyond-crop-pad
src/toy/train/vision.cpp
toy_vision_tests
^VisionGaps\.TrainingStepsSee
const int64_t span = 2 * pad + 1;
const int64_t span = 2 * pad + 3;
augment-fill-not-zero
src/toy/train/vision.cpp
toy_vision_tests
^VisionGaps\.TrainingStepsSee
src[(c * H + sy) * W + sx] : uint8_t(0);
src[(c * H + sy) * W + sx] : uint8_t(255);
image-read-stays-interleaved
src/toy/data/images.cpp
toy_vision_tests
^VisionGaps\.ImagesKeep
im.pixels[size_t(k * hw + i)] = inter[size_t(i * want + k)];
im.pixels[size_t(i * want + k)] = inter[size_t(i * want + k)];
png-written-planar
src/toy/data/images.cpp
toy_vision_tests
^VisionGaps\.ImagesKeep
inter[size_t(i * channels + k)] = planar[k * hw + i];
inter[size_t(i * channels + k)] = planar[i * channels + k];
vision-step-ignores-label-smoothing
src/toy/train/vision.cpp
toy_vision_tests
^VisionGaps\.TrainingStepUsesTheRunsLabelSmoothing
                                      r_.o.label_smoothing);
                                      0.0f);
label-smoothing-keeps-full-ce
src/toy/models/vit.cpp
toy_vision_tests
^VisionGaps\.LabelSmoothing
return add(scale(ce, 1.0f - label_smoothing), scale(uniform, label_smoothing));
return add(ce, scale(uniform, label_smoothing));
q8-hsum-order
src/toy/backend/cpu/simd.h
toy_op_tests
^QuantGaps\.BlockProducts
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ps(lo, _mm_shuffle_ps(lo, lo, 0x1B));
quant-512-odd-row-takes-its-partner
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^QuantGaps\.BlockProducts
          put(r, rw, n0, rows, 2 * p, res);
          put(r, rw, n0, rows, rows, res);
quant-second-row-of-a-pair-misread
src/toy/backend/cpu/quant_products.cpp
toy_op_tests
^QuantGaps\.BlockProducts
(j / 2) * nb * kPairBlock + (j % 2) * 32;
(j / 2) * nb * kPairBlock;
q8k-nan-block-scale-zero
src/toy/backend/cpu/gemv_blocks.cpp
toy_op_tests
^QuantGaps\.NonFiniteActivations
scale = NAN;
scale = 0;
q8k-inf-block-scale-zero
src/toy/backend/cpu/gemv_blocks.cpp
toy_op_tests
^QuantGaps\.NonFiniteActivations
} else if (am != 0.0f) {
} else if (am != 0.0f && std::isfinite(am)) {
serve-half-closed-client-dropped
src/toy/serve/connection.cpp
toy toy_serve_tests
^ServeRobustness\.(AHalfClosed|APeerWithBytes)
  if (r > 0) return false;  // bytes still to read (a pipelined request): not gone yet
  (void)r;
grad-pass-not-summed-first
src/toy/autograd/backward.cpp
toy_core_tests
^GradPasses\.
    if (s.finished || s.pending > 0 || hidden_pending_ > 0 || !s.sum.defined()) return;
    if (s.finished || !s.sum.defined()) return;
grad-ready-never-called
src/toy/autograd/backward.cpp
toy_core_tests toy_train_tests
^GradPasses\.|^Loop\.Gradients
    if (ready_) ready_(s.leaf);
    (void)ready_;
recomputed-leaves-not-held
src/toy/autograd/backward.cpp
toy_core_tests
^GradPasses\.
  out.grad_fn()->reaches_hidden_leaves = true;  // the parameters fn captures
  (void)0;
loop-stop-after-ignored
src/toy/train/loop.cpp
toy_train_tests toy toy_hostile_tests
^Loop\.|^Hostile\.
(o_.stop_after > 0 && st_.step >= o_.stop_after)
(false)
arena-grad-not-accumulated
src/toy/autograd/backward.cpp
toy_train_tests
^ParamArena\.
        add_(home, sum);
        copy_(home, sum);
adamw-ranges-skip-decay
src/toy/backend/cpu/optim.cpp
toy_train_tests
^ParamArena\.
c, r->decay ? a.weight_decay : 0.0f);
c, 0.0f);
arena-move-leaves-views
src/toy/nn/params.cpp
toy_train_tests
^ParamArena\.
      alias_storage_(p.value, arena_.values, p.arena_offset);\n      alias_storage_(p.m, arena_.m, p.arena_offset);
      alias_storage_(p.m, arena_.m, p.arena_offset);
layer-norm-composite-not-centred
src/toy/ops/fallbacks.cpp
toy_sim_tests
^Fallbacks\.
  const Tensor centred = sub(xf, mean(xf, last_axis(xf), true));
  const Tensor centred = xf;
attention-composite-ignores-segments
src/toy/ops/fallbacks.cpp
toy_sim_tests
^Fallbacks\.
  if (o.segments.defined()) {
  if (false) {
attention-composite-wrong-kv-head
src/toy/ops/fallbacks.cpp
toy_sim_tests
^Fallbacks\.
expand(unsqueeze(f, 3), Shape{B, S, Hkv, group, d})
expand(unsqueeze(f, 2), Shape{B, S, group, Hkv, d})
clock-lr-one-step-late
src/toy/backend/cpu/optim.cpp
toy_train_tests
^OptimizerClock\.
  lr_t.data<float>()[0] = cosine_lr(int64_t(position.data<int32_t>()[0]), s);
  lr_t.data<float>()[0] = cosine_lr(int64_t(step_t.data<float>()[0]) - 1, s);
clock-not-resynced-on-resume
src/toy/train/optimizer.h
toy_train_tests
^OptimizerClock\.
  void set_steps(int64_t s) { steps_ = s, clock_synced_ = false; }
  void set_steps(int64_t s) { steps_ = s; }
ids-mark-on-host-tensor
src/toy/ops/common.cpp
toy_sim_tests
^Sim\.
  if (up.is_same(ids)) up = contiguous_copy(ids);  // (d is the host: mark a copy, not the caller's tensor)\n  TensorImpl* t = up.impl();
  if (up.is_same(ids)) up = contiguous_copy(ids);  // (d is the host: mark a copy, not the caller's tensor)\n  TensorImpl* t = ids.impl();
vision-accuracy-read-per-micro-batch
src/toy/train/vision.cpp
toy toy_sim_tests
^SimCli\.Vision
    predictions_.push_back(argmax(logits.detach(), -1));
    predictions_.push_back(argmax(logits.detach(), -1));\n    (void)predictions_.back().to_f32_vector();
pending-block-reused-at-once
src/toy/core/allocator.cpp
toy_core_tests
^Allocator\.
    if (pending.events.empty()) {
    if (true) {
recompute-draws-from-callers-generator
src/toy/models/decoder_lm.cpp
toy_finetune_tests
^Recompute\.
          if (g && !*first) again = **replay, draw = &again;
          if (g && !*first) *g = **replay, draw = g;
dropout-ignores-device-step
src/toy/backend/cpu/elementwise.cpp
toy_sim_tests
^Sim\.Dropout
    const uint64_t counter = a.counter + (a.step ? uint64_t(uint32_t(a.step->data<int32_t>()[0])) << 32 : 0);
    const uint64_t counter = a.counter;
step-clock-not-advanced
src/toy/train/step_clock.cpp
toy_sim_tests toy_op_tests
^Sim\.Dropout|^OptimizerClock\.
  advance_step_clock(step_);
  (void)step_;
step-clock-not-resynced
src/toy/train/step_clock.cpp
toy_train_tests
^OptimizerClock\.
  if (holds_ != step) fill_(step_, double(step)), holds_ = step;
  if (holds_ < 0) fill_(step_, double(step)), holds_ = step;
sample-penalty-padding-applied
src/toy/backend/cpu/sample.cpp
toy_op_tests toy_train_tests
^OpGrad\.sample_token|^Sampler\.
    if (count == 0) continue;  // padding
    (void)count;
top-p-not-renormalised
src/toy/backend/cpu/sample.cpp
toy_op_tests toy_train_tests toy_sim_tests
^OpGrad\.sample_token|^Sampler\.|^Generate\.|^Sim\.
  for (double& v : p) v /= s;\n}
  (void)s;\n}
random-fill-per-block-off
src/toy/backend/cpu/random.cpp
toy_op_tests
^OpGrad\.random_fill
        const auto u = philox4x32(a.seed, a.stream, a.counter + uint64_t(i) / per);
        const auto u = philox4x32(a.seed, a.stream, a.counter + uint64_t(i) / 4);
arange-off-by-one
src/toy/backend/cpu/random.cpp
toy_op_tests
^OpGrad\.arange
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = int32_t(i);
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = int32_t(i + 1);
tojson-compact-separators
src/toy/chat/value_json.cpp
toy_chat_tests
^ChatReference\.|^Jinja\.
    item_sep_ = !s.item_sep.empty() ? s.item_sep : s.has_indent ? "," : ", ";
    item_sep_ = !s.item_sep.empty() ? s.item_sep : s.has_indent ? "," : ",";
loop-last-off-by-one
src/toy/chat/render.cpp
toy_chat_tests
^ChatReference\.|^Jinja\.
    d.set(Value("last"), Value(k == n - 1));
    d.set(Value("last"), Value(k == n));
template-loops-unbounded
src/toy/chat/render.cpp
toy_chat_tests
^Jinja\.RendersAreBounded
      if (++loop_steps_ > render_limits().loop_steps || out.size() > render_limits().text_bytes)
      if (false)
chat-content-parsed-as-markers
src/toy/infer/chat.cpp
toy_chat_tests toy_serve_tests
^ChatPrompt\.|^ServeHttp\.ChatMessagesAreText
  const Masker masker(controls_, source_, {&messages, &tools});
  const Masker masker({}, source_, {&messages, &tools});
chat-plain-spans-ignored
src/toy/tokenizer/tokenizer.cpp
toy_chat_tests toy_serve_tests
^ChatPrompt\.|^ServeHttp\.ChatMessagesAreText
      if (text.substr(pos, s.text.size()) == s.text && !(s.control && overlaps_plain(pos, s.text.size()))) {
      if (text.substr(pos, s.text.size()) == s.text) {
chat-double-bos
src/toy/infer/chat.cpp
toy_chat_tests
^ChatPrompt\.OneBos
  strip_bos_ = tok.adds_bos() && !bos_.empty();
  strip_bos_ = false;
chat-users-bos-dropped
src/toy/infer/chat.cpp
toy_chat_tests
^ChatPrompt\.OneBos
  if (strip_bos_ && t.text.starts_with(bos_) && (t.plain.empty() || t.plain.front().begin >= bos_.size()))
  if (strip_bos_ && t.text.starts_with(bos_))
chat-tool-arguments-left-a-string
src/toy/serve/openai.cpp
toy toy_serve_tests
^ServeCli\.ChatTemplateFlag
        if (args.is_object()) call["function"]["arguments"] = std::move(args);
        if (false) call["function"]["arguments"] = std::move(args);
chat-template-flag-ignored
src/toy/cli/cmd_serve.cpp
toy toy_serve_tests
^ServeCli\.ChatTemplateFlag
  const ChatTemplate tmpl = ChatTemplate::choose(f.chat_template, reader, *lm.tokenizer);
  const ChatTemplate tmpl = ChatTemplate::choose("", reader, *lm.tokenizer);
serve-tools-never-offered
src/toy/serve/server.cpp
toy toy_serve_client_tests
^ServeClients\.TheOpenAIClientCallsATool
        offer_tools = chat && !cr.tools.is_null() && cr.tool_choice != "none";
        offer_tools = false;
serve-streamed-calls-dropped
src/toy/serve/server.cpp
toy toy_serve_client_tests
^ServeClients\.TheOpenAIClientCallsATool
              if (now.tool_calls.size() > sent.tool_calls.size()) {
              if (false) {
reply-calls-left-in-content
src/toy/infer/chat_output.cpp
toy_chat_tests
^ChatOutput\.
  std::string content(trim(rest.substr(0, calls.start)));
  std::string content(trim(rest));
reply-half-marker-shown
src/toy/infer/chat_output.cpp
toy_chat_tests
^ChatOutput\.
    if (partial && tools) content.remove_suffix(unfinished_marker(content, opening_marker(syntax.tools)));
    if (false) content.remove_suffix(unfinished_marker(content, opening_marker(syntax.tools)));
reply-reasoning-kept-open
src/toy/infer/chat_output.cpp
toy_chat_tests
^ChatOutput\.
  s.starts_thinking = !think_open.empty() && trim_end(prompt).ends_with(think_open);
  s.starts_thinking = false;
sft-tools-not-rendered
src/toy/data/sft.cpp
toy toy_serve_client_tests
^ServeClients\.TheOpenAIClientCallsATool
      if (assistant) next_piece(chat.render(upto, true, tools), false);
      if (assistant) next_piece(chat.render(upto, true), false);
logprobs-after-sampling-cut
src/toy/serve/engine.cpp
toy_serve_tests toy_llamacpp_tests
^ServeHttp\.Logprobs|^LlamaCpp\.ServedLogprobs
    TokenLogprob lp{id, logprobs[size_t(id)], {}};
    TokenLogprob lp{id, logprobs[size_t(id)] * 0.5f, {}};
logprobs-top-unsorted
src/toy/serve/engine.cpp
toy_serve_tests toy_llamacpp_tests
^ServeHttp\.Logprobs|^LlamaCpp\.ServedLogprobs
      return logprobs[size_t(a)] > logprobs[size_t(b)] || (logprobs[size_t(a)] == logprobs[size_t(b)] && a < b);
      return a < b;
embeddings-unnormalised
src/toy/serve/engine.cpp
toy_serve_tests toy_llamacpp_tests
^ServeHttp\.Embeddings|^LlamaCpp\.Embeddings
        if (norm > 0)
        if (false)
embeddings-mean-is-last
src/toy/serve/engine.cpp
toy_serve_tests toy_llamacpp_tests
^ServeHttp\.Embeddings|^LlamaCpp\.Embeddings
        if (task->pooling == Pooling::Mean) {
        if (false) {
grammar-first-draw-unchecked
src/toy/serve/engine.cpp
toy_serve_tests
^ServeHttp\.StructuredOutput
  } else if (GrammarMatcher next(*s.matcher); next.accept_token(first, tok_.token_bytes(first), is_special(first))) {
  } else if (GrammarMatcher next(*s.matcher); (void)next.accept_token(first, tok_.token_bytes(first), is_special(first)), true) {
grammar-end-any-time
src/toy/serve/engine.cpp
toy_serve_tests
^ServeHttp\.StructuredOutput
    if (s.matcher->complete()) return first;
    return first;
grammar-overlong-utf8
src/toy/infer/grammar.cpp
toy_chat_tests toy_serve_tests
^Grammar\.|^ServeHttp\.StructuredOutput
  lo = std::max(lo, n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u);
  lo = std::max(lo, 0u);
schema-optional-required
src/toy/infer/json_schema.cpp
toy_chat_tests toy_serve_tests
^JsonSchema\.|^ServeHttp\.StructuredOutput
        is_required.push_back(required.count(key) > 0);
        is_required.push_back(false);
mask-chain-horizon-ignored
src/toy/infer/grammar.cpp
toy_chat_tests toy_serve_tests
^Grammar\.|^JsonSchema\.|^ServeHttp\.StructuredOutput
      const bool far = c.id != 0 && c.remaining > horizon;
      const bool far = c.id != 0;
finetune-template-not-carried
src/toy/train/finetune_model.cpp
toy toy_cli_tests
^CliFinetune\.ChatTemplateFlag
    r.chat_template = r.chat->source();
    r.chat_template = chat_template_of(vocab_file);
token-element-negation-ignored
src/toy/infer/grammar.h
toy_chat_tests
^Grammar\.TokenElements|^TokenMasker\.
    bool matches_token(int32_t id) const { return kind == Token && (id == token) != negated; }
    bool matches_token(int32_t id) const { return kind == Token && id == token; }
utf8-surrogate-lead-viable
src/toy/infer/grammar.cpp
toy_chat_tests
^JsonSchema\.EveryText|^ToolGrammar\.|^TokenMasker\.
  return any(lo, std::min(hi, 0xD7FFu)) || any(std::max(lo, 0xE000u), hi);
  return any(lo, hi);
json-lone-surrogate-escape
src/toy/infer/json_schema.cpp
toy_chat_tests
^JsonSchema\.
 | [dD] [0-7] [0-9a-fA-F]{2} |
 | [dD] [0-9a-fA-F]{3} |
tool-strings-may-hold-markers
src/toy/infer/tool_grammar.cpp
toy_chat_tests
^ToolGrammar\.
    sp.forbidden = markers;
    sp.forbidden = {};
tool-markers-never-tokens
src/toy/infer/tool_grammar.cpp
toy_chat_tests
^ToolGrammar\.|^TokenMasker\.
    return it != specials_.end() ? fmt::format("<[{}]>", it->second) : lit(text);
    return lit(text);
tool-choice-required-unconstrained
src/toy/serve/server.cpp
toy_serve_tests
^ServeHttp\.RequiredTool
              if (cr.tool_choice == "required") {  // the reply is calls, in the template's format
              if (false) {  // the reply is calls, in the template's format
streamer-sends-arguments-again
src/toy/infer/chat_output.cpp
toy_chat_tests
^ToolGrammar\.
      out.push_back({k, false, "", "", target.substr(sent.size())});
      out.push_back({k, false, "", "", target});
call-in-progress-never-reported
src/toy/infer/chat_output.cpp
toy_chat_tests
^ToolGrammar\.
  if (partial && !calls.ok && calls.stop != npos) out.call_in_progress = call_being_written(rest.substr(calls.stop), syntax.tools);
  (void)0;
grammar-key-drops-place-in-alternative
src/toy/infer/grammar.cpp
toy_chat_tests toy_serve_tests
^Grammar\.|^TokenMasker\.|^ToolGrammar\.|^JsonSchema\.|^ServeHttp\.StructuredOutput
      put(far ? 0x80000000u | c.id : p.rule), put(p.alt), put(p.index), put(far ? horizon : 0u);
      put(far ? 0x80000000u | c.id : p.rule), put(p.alt), put(far ? horizon : 0u);
grammar-expand-leaves-stack-changed
src/toy/infer/grammar.cpp
toy_chat_tests
^Grammar\.|^TokenMasker\.|^ToolGrammar\.
  s.push_back(e);
  (void)e;
gemm-bias-ignored
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^GemmF32\.
          const Start from = load ? Start{cij, ldc} : bias ? Start{bias + j, 0} : Start{};
          const Start from = load ? Start{cij, ldc} : Start{};
gemm-bias-every-k-block
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^GemmF32\.
      const bool load = accumulate || k0 > 0;
      const bool load = accumulate;
attention-kt-read-unpadded
src/toy/backend/cpu/attention.cpp
toy_op_tests
^(Forward\.Attention|OpGrad\.attention|Torch\.attention)
        block_gemm(false, rows, cols, g.D, g.scale, g.qrow(b, i0, h), g.qs1, kt + j0, ldt, 0.0f, s, kChunk);
        block_gemm(false, rows, cols, g.D, g.scale, g.qrow(b, i0, h), g.qs1, kt + j0, g.S, 0.0f, s, kChunk);
attention-backward-vt-read-unpadded
src/toy/backend/cpu/attention.cpp
toy_op_tests
^(Forward\.Attention|OpGrad\.attention|Torch\.attention)
          block_gemm(false, rows, cols, g.Dv, 1.0f, dO_i, ldo, vt + j0, ldt, 0.0f, dp, kChunk);
          block_gemm(false, rows, cols, g.Dv, 1.0f, dO_i, ldo, vt + j0, g.S, 0.0f, dp, kChunk);
linear-bias-fallback-drops-the-bias
src/toy/ops/matmul.cpp
toy_sim_tests
^Fallbacks\.LinearBias
    k_matmul(x.device())(x2, t_view(w), y, 1.0f, beta);
    k_matmul(x.device())(x2, t_view(w), y, 1.0f, 0.0f);
linear-bias-kernel-skipped-on-cpu
src/toy/ops/matmul.cpp
toy_op_tests
^GemmF32\.Linear
    k_matmul_bias(x.device())(x2, t_view(w), contiguous_nograd(b), y);
    k_matmul(x.device())(x2, t_view(w), y, 1.0f, 0.0f);
row-sums-runs-of-32
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
    if (k_end % 64 != 0 && k_end != K) return;
    if (k_end % 32 != 0 && k_end != K) return;
row-sums-every-group-of-panels
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
    pack_a_block(a, i0 + r0, i0 + r1, k0, k1, block, first && sums ? &*sums : nullptr);
    pack_a_block(a, i0 + r0, i0 + r1, k0, k1, block, sums ? &*sums : nullptr);
linear-bias-gradient-from-row-sums-dropped
src/toy/ops/matmul.cpp
toy_op_tests
^GemmF32\.Linear
        r[1] = dw, r[2] = db;
        r[1] = dw, r[2] = sum(dw, 1);
square-norms-not-squared
src/toy/backend/cpu/reduce.cpp
toy_train_tests
^ParamArena\.
    if constexpr (kSquares) v = _mm256_mul_ps(v, v);
    (void)0;
square-norms-tail-not-squared
src/toy/backend/cpu/reduce.cpp
toy_train_tests
^ParamArena\.
    if constexpr (kSquares) x = x * x;
    (void)0;
mask-walk-shallow-key
src/toy/infer/grammar_mask.cpp
toy_chat_tests
^TokenMasker\.
  auto [it, fresh] = st.ids.emplace(m.key(horizon_), int32_t(st.matcher.size()));
  auto [it, fresh] = st.ids.emplace(m.key(1), int32_t(st.matcher.size()));
ring-forgets-last-old-key
src/toy/nn/attention.cpp
toy_model_tests
^Decoder\.PublishedArchitecturesDecode
  const int64_t m = std::min(start, R - 1);  // cached positions the first new query sees
  const int64_t m = std::min(start, R - 2);  // cached positions the first new query sees
window-mask-off-by-one
src/toy/backend/cpu/attention.cpp
toy_op_tests
^Forward\.AttentionSlidingWindow
    if (g.window > 0) first = std::clamp<int64_t>(i + g.off - g.window + 1 - j0, 0, visible);
    if (g.window > 0) first = std::clamp<int64_t>(i + g.off - g.window - j0, 0, visible);
window-decode-starts-at-zero
src/toy/backend/cpu/attention.cpp
toy_op_tests
^Forward\.AttentionSlidingWindow
    const int64_t j_first = g.key_begin(0), S = g.key_end(1) - j_first;
    const int64_t j_first = 0, S = g.key_end(1) - j_first;
swa-layers-global-base
src/toy/models/decoder_lm.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/gemma3
  o.freq_base = c.swa.rope_base;
  o.freq_base = c.rope.base;
gemma-post-norm-skipped
src/toy/models/decoder_lm.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/gemma3
  if (b.ffn_post_norm.defined()) m = b.ffn_post_norm(m);
  (void)0;
softcap-missing
src/toy/models/decoder_lm.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/gemma3
  if (cfg_.logit_softcap == 0.0f) return z;
  if (true) return z;
smollm3-rope-everywhere
src/toy/models/config.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/smollm3
  return pos == PosKind::RoPE && (nope_interval == 0 || (l + 1) % nope_interval != 0);
  return pos == PosKind::RoPE;
longrope-always-short
src/toy/nn/attention.h
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/phi3
    return rope_long && context > long_after ? rope_long : rope;
    return rope;
longrope-no-attn-factor
src/toy/models/decoder_lm.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/phi3
  if (c.rope.long_short) o.attn_factor = c.rope.attn_factor;  // LongRoPE's cos/sin scale
  (void)0;
fused-gate-up-halves-swapped
src/toy/nn/mlp.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/phi3
  if (!gate.defined()) return down(swiglu(up(x)));  // gate and up fused in one [2F, D] weight
  if (!gate.defined()) return down(swiglu(concat({slice(up(x), -1, up.out_features() / 2, up.out_features()), slice(up(x), -1, 0, up.out_features() / 2)}, -1)));
moe-weights-never-renormalised
src/toy/nn/moe.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/qwen3moe
  if (norm_weights)
  if (false)
moe-grouped-slot-order
src/toy/nn/moe.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/qwen3moe
      for (int32_t i : pairs[size_t(e)]) where[size_t(i)] = next++;
      for (int32_t i : pairs[size_t(e)]) where[size_t(i ^ 1)] = next++;
moe-shared-expert-skipped
src/toy/nn/moe.cpp
toy_model_tests
^Decoder\.PublishedArchitectureGradients
  if (shared.down.defined()) out = add(out, cast(shared(x2), DType::F32));
  (void)0;
olmoe-qk-norm-per-head
src/toy/nn/attention.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/olmoe
  if (norm_whole) {
  if (false) {
moe-aux-loss-dropped
src/toy/models/decoder_lm.cpp
toy_model_tests
^Moe\.LoadBalancing
    if (b.defined()) aux = scale(b, moe_aux_coef_);
    (void)0;
granite-residual-scale-once
src/toy/models/decoder_lm.cpp
toy_llamacpp_tests
^LlamaCpp\.RunsToyInitModels
  if (cfg_.residual_scale != 0.0f) m = scale(m, cfg_.residual_scale);
  (void)0;
quantize-moe-8-experts-rule
src/toy/io/quantize.cpp
toy toy_llamacpp_tests
^LlamaCpp\.QuantizesMixturesOfExperts
        if (n_experts == 8 && kind.base == DType::Q4_K) type = DType::Q5_K;
        (void)0;
ring-chunk-unrounded-keys
src/toy/nn/attention.cpp
toy_model_tests
^Decoder\.PublishedArchitecturesDecode
  Tensor kh = kc.dtype() == k.dtype() ? k : as(cast(k, kc.dtype()));
  Tensor kh = k;
shortconv-b-and-c-swapped
src/toy/nn/short_conv.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/lfm2
  Tensor bx = mul(slice(bcx, 2, 0, D), slice(bcx, 2, 2 * D, 3 * D));
  Tensor bx = mul(slice(bcx, 2, D, 2 * D), slice(bcx, 2, 2 * D, 3 * D));
shortconv-tail-kept-stale
src/toy/nn/short_conv.cpp
toy_model_tests
^Decoder\.PublishedArchitecturesDecode
  copy_(*tail, contiguous(slice(in, 1, T, T + K - 1)));
  (void)0;
lfm2-no-kv-heads-read-as-attention
src/toy/io/model_file.cpp
toy_model_tests
^Arch/HfFixture\.ToyMatchesTheReferenceForEveryWeightType/lfm2
    c.layer_kinds.push_back(h == 0 ? LayerKind::ShortConv : LayerKind::Attention);
    c.layer_kinds.push_back(LayerKind::Attention);
quantize-shortconv-taps
src/toy/io/quantize.cpp
toy toy_llamacpp_tests
^LlamaCpp\.QuantizesLfm2
         !contains(t.name, "shortconv.conv.weight") &&
         true &&
expert-lora-skipped-on-grouped-experts
src/toy/nn/moe.cpp
toy_model_tests
^Moe\.ExpertLora
    y = with_lora(d, down_lora, h, sel);
    y = d;
expert-lora-unscaled
src/toy/nn/moe.cpp
toy_model_tests
^Moe\.ExpertLora
  return add(y, l.scale == 1.0f ? low : scale(low, l.scale));
  return add(y, low);
dp-reduce-in-reverse-rank-order
src/toy/dist/data_parallel.cpp
toy toy_dist_tests
^DataParallel\.(FourProcesses|TwoProcesses)
    for (int r = 0; r < size(); ++r) {\n      const float* c;
    for (int r = size() - 1; r >= 0; --r) {\n      const float* c;
dp-micro-batch-not-addressed-by-rank
src/toy/train/loop.cpp
toy toy_dist_tests
^DataParallel\.TwoProcesses
MicroBatch{s.step, me + ranks * micro, global, &device_step}
MicroBatch{s.step, micro, global, &device_step}
windows-addressed-by-micro-batch
src/toy/train/step.cpp
toy_train_tests toy toy_dist_tests
^(Train\.OneMicroBatchOfEight|DataParallel\.TwoProcessesOfFour)
  Generator data = data_gen_.for_micro_batch(mb.step, 0);
  Generator data = data_gen_.for_micro_batch(mb.step, mb.index);
windows-forget-the-step
src/toy/train/step.cpp
toy_train_tests
^Train\.OneMicroBatchOfEight
  data.set_offset(data.offset() + uint64_t(mb.index) * uint64_t(batches_.batch()));
  data.set_offset(uint64_t(mb.index) * uint64_t(batches_.batch()));
dp-kernel-reads-values-before-they-arrive
src/toy/dist/data_parallel.cpp
toy toy_dist_tests
^DataParallel(TwoHosts)?\.(TwoProcessesTrainAsOne|TwoNetworkNamespaces|ASlowLink)
      if (awaiting_[size_t(k)]) wait_piece(k);
      if (false && awaiting_[size_t(k)]) wait_piece(k);
dp-buckets-ignore-the-shard-size
src/toy/dist/data_parallel.cpp
toy_dist_tests
^DataParallel\.ASmallModelHasBucketsOfAnEighthOfAShard
std::min<int64_t>(int64_t(o_.bucket_mb * 1024 * 1024 / 4), std::max<int64_t>(kPieceElements, largest / 8))
std::min<int64_t>(int64_t(o_.bucket_mb * 1024 * 1024 / 4), std::max<int64_t>(kPieceElements, largest * 8))
gpu-gelu-gradient-drops-the-cubic
src/toy/backend/cuda/unary_math.h
toy_op_tests
^CudaMath\.
      const float du2 = (2.0f * 0.7978845608028654f) * f_fma(3.0f * 0.044715f, x * x, 1.0f);
      const float du2 = (2.0f * 0.7978845608028654f);
gpu-adamw-without-bias-correction
src/toy/backend/cuda/train_launch.h
toy_op_tests
^CudaTrainMath\.
  c.step_size = div_rn(lr, bc1);
  c.step_size = lr;
mixed-precision-backward-leaves-the-gradient-unrounded
src/toy/ops/matmul.cpp
toy_finetune_tests
^MixedPrecision\.
        const Tensor gr = rounded(g);
        const Tensor gr = g;
train-precision-flag-ignored
src/toy/train/trainer.cpp
toy toy_sim_tests
^SimCli\.TrainInBf16
  r.model->set_mixed_precision(precision_type(o.precision));
  r.model->set_mixed_precision(DType::F32);
mixed-precision-skips-the-head
src/toy/models/decoder_lm.h
toy_model_tests
^DecoderLM\.MixedPrecisionCoversTheOutputHead
    head_.compute = compute;
    head_.compute = DType::F32;
chunked-loss-head-not-rounded
src/toy/models/decoder_lm.cpp
toy_model_tests
^DecoderLM\.MixedPrecisionCoversTheOutputHead
        linear_cross_entropy(h, head_w, targets_d,
        linear_cross_entropy(h, head_.weight, targets_d,
bench-run-reads-device-logits-on-the-host
src/toy/cli/bench_run.cpp
toy toy_sim_tests
^SimCli\.BenchRun
          if (is_host(logits.device())) {
          if (true) {
kernel-gate-not-passed-on-cpu
src/toy/backend/sim/sim_kernel.h
toy_core_tests
^KernelGate\.
    pass_kernel_gate(a...);\n    return F(std::forward<A>(a)...);
    return F(std::forward<A>(a)...);
dp-updated-values-not-shared
src/toy/train/loop.cpp
toy toy_dist_tests
^DataParallel\.TwoProcesses
    if (dp) dp->share_values();
    if (dp && false) dp->share_values();
norm-chunks-follow-threads
src/toy/backend/cpu/norm.cpp
toy toy_cli_tests
^CliTrain\.TheTrainedBitsDoNotDependOnTheThreadCount
std::min<int64_t>(kMaxNormChunks, rows * D / 8192)
std::min<int64_t>(num_threads(), rows * D / 8192)
softmax-stream-reads-the-row-it-writes
src/toy/backend/cpu/softmax.cpp
toy_op_tests
^KernelForms\.StreamingSoftmax
    const float sum = wide ? exps_beside_stores512(z, scale, mx, ebuf[0], next, ebuf[1], pending_inv, pending_y, D)
    const float sum = wide ? exps_beside_stores512(z, scale, mx, ebuf[0], next, ebuf[0], pending_inv, pending_y, D)
softmax-512-halves-swapped
src/toy/backend/cpu/softmax.cpp
toy_op_tests
^KernelForms\.StreamingSoftmax
  __m256 s0 = low256(s);
  __m256 s0 = high256(s);
exp512-flush-threshold
src/toy/backend/cpu/simd512.h
toy_op_tests
^KernelForms\.StreamingSoftmax
_mm512_set1_ps(-87.3365402f)
_mm512_set1_ps(-88.5f)
block-gemm-beta-one-only
src/toy/backend/cpu/block_gemm.cpp
toy_op_tests
^KernelForms\.BlockGemm
      if (beta != 0.0f) out = _mm512_fmadd_ps(
      if (beta == 1.0f) out = _mm512_fmadd_ps(
block-gemm-avx2-mask-one-lane-too-many
src/toy/backend/cpu/block_gemm.cpp
toy_op_tests
^KernelForms\.BlockGemm
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)),
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n) + 1),
block-gemm-transposed-a-read-plain
src/toy/backend/cpu/block_gemm.cpp
toy_op_tests
^KernelForms\.BlockGemm|Attention
  const AStrides as = trans_a ? AStrides{1, lda} : AStrides{lda, 1};
  const AStrides as = AStrides{lda, 1};
attention-512-exp-sum-halves-swapped
src/toy/backend/cpu/simd512.h
toy_op_tests
^KernelForms\.Attention
  float sum = hsum256(_mm256_add_ps(s0, high256(s)));
  float sum = hsum256(_mm256_add_ps(s0, low256(s)));
moe-weight-slot-reads-row-0
src/toy/backend/cpu/moe.cpp
toy_op_tests
^Forward\.StoredExperts
  auto x_row = [&](int64_t pair) { return pair / d.U * d.X + (d.X == 1 ? 0 : pair % d.U); };
  auto x_row = [&](int64_t pair) { return pair / d.U * d.X; };
moe-weight-block-past-the-rows
src/toy/backend/cpu/moe.cpp
toy_op_tests
^Forward\.StoredExperts
      const int64_t e = few[size_t(b / span)], r0 = b % span, r1 = std::min(d.N, r0 + kBlock);
      const int64_t e = few[size_t(b / span)], r0 = b % span, r1 = r0 + kBlock > d.N ? r0 : r0 + kBlock;
moe-weight-only-the-first-block-handed
src/toy/backend/cpu/moe.cpp
toy_op_tests
^Forward\.StoredExperts
    for (int64_t b = b0; b < b1; b += kBlock) {
    for (int64_t b = b0; b < b0 + 1; b += kBlock) {
moe-weight-many-pairs-from-the-blocks
src/toy/backend/cpu/moe.cpp
toy_op_tests
^Forward\.StoredExperts
    if (int64_t(pe.size()) <= kGemvMaxRows && gemv_blocks_supports(t)) {
    if (gemv_blocks_supports(t)) {
moe-prepared-k-rows-unquantized-sums
src/toy/backend/cpu/gemv_blocks.cpp
toy_op_tests
^Forward\.StoredExperts
  const Q8Row q{d, reinterpret_cast<const int8_t*>(d + K_ / 32), reinterpret_cast<const int16_t*>(d + K_ / 32 + K_ / 4)};
  const Q8Row q{d, reinterpret_cast<const int8_t*>(d + K_ / 32), reinterpret_cast<const int16_t*>(d + K_ / 32)};
attention-decode-every-row-reads-query-0
src/toy/backend/cpu/attention.cpp
toy_op_tests
^Forward\.AttentionDecode
    g.q += i * g.qs0;  // sequence i's query row, as batch 0 of its own geometry
    g.q += 0;
attention-decode-f16-cache-read-as-f32
src/toy/backend/cpu/attention.cpp
toy_op_tests
^Forward\.AttentionDecode
  const bool half = ks[0].dtype() == DType::F16;
  const bool half = false;
attention-decode-composite-keeps-f16
src/toy/ops/attention.cpp
toy_sim_tests
^Fallbacks\.AttentionDecode
    auto as_q = [&](const Tensor& t) { return t.dtype() == q.dtype() ? t : cast(t, q.dtype()); };
    auto as_q = [&](const Tensor& t) { return t; };
adamw-avx512-form-second-moment-takes-beta1
src/toy/backend/cpu/optim.cpp
toy_op_tests
^KernelForms\.AdamW
    const __m512 vv = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(vc2, _mm512_mul_ps(gv, gv)));
    const __m512 vv = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(vc1, _mm512_mul_ps(gv, gv)));
sigmoid-avx512-form-takes-a-reciprocal-estimate
src/toy/backend/cpu/simd512.h
toy_op_tests
^KernelForms\.Activations
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), d);
  const __m512 r = _mm512_rcp14_ps(d);
sigmoid-avx512-form-ignores-the-sign
src/toy/backend/cpu/simd512.h
toy_op_tests
^KernelForms\.Activations
  *s = _mm512_mask_blend_ps(negative, r, tr);
  *s = r;
swiglu-avx512-form-up-gradient-takes-one-minus-s
src/toy/backend/cpu/elementwise.cpp
toy_op_tests
^KernelForms\.Activations
  *db = _mm512_mul_ps(g, _mm512_mul_ps(a, s));
  *db = _mm512_mul_ps(g, _mm512_mul_ps(a, c));
moe-weight-prepares-only-the-first-row
src/toy/backend/cpu/moe.cpp
toy_op_tests
^Forward\.StoredExperts
    for (int64_t pair : pairs[size_t(e)]) needed[size_t(x_row(pair))] = 1;
    for (int64_t pair : pairs[size_t(e)]) needed[0] = pair >= 0;
swiglu-avx512-streamed-upper-half-takes-the-lower
src/toy/backend/cpu/elementwise.cpp
toy_op_tests
^KernelForms\.StreamingSwiglu
      _mm256_stream_ps(o + i + 8, high256(v));
      _mm256_stream_ps(o + i + 8, low256(v));
amx-tile-second-a-tile-meets-the-first-b-twice
src/toy/backend/cpu/gemm_bf16.cpp
toy_op_tests
^GemmBf16\.
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(2, 4, 6);
dot-tile-forgets-c-between-k-blocks
src/toy/backend/cpu/gemm_bf16.cpp
toy_op_tests
^GemmBf16\.
                 int(std::min<int64_t>(kNR, N - j)), accumulate || p0 > 0);
                 int(std::min<int64_t>(kNR, N - j)), accumulate);
amx-forgets-c-between-k-blocks
src/toy/backend/cpu/gemm_bf16.cpp
toy_op_tests
^GemmBf16\.
                 int(std::min<int64_t>(32, N - j)), accumulate || p0 > 0);
                 int(std::min<int64_t>(32, N - j)), accumulate);
bf16-pack-transpose-swaps-two-row-quarters
src/toy/backend/cpu/gemm_bf16.cpp
toy_op_tests
^GemmBf16\.
    r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
bf16-weight-prompt-reads-w-untransposed
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^GemmBf16\.
    return gemm_bf16(N, out, in, {x.data<float>(), false, in, 1}, {w.raw_data(), true, 1, in}, y.data<float>(), out,
    return gemm_bf16(N, out, in, {x.data<float>(), false, in, 1}, {w.raw_data(), true, in, 1}, y.data<float>(), out,
half-pack-transpose-swaps-two-k
src/toy/backend/cpu/gemm_half.cpp
toy_op_tests
^GemmHalf\.
    b[4 * h + 1] = _mm_unpackhi_epi32(s[0], s[2]);  // k 2, 3
    b[4 * h + 1] = _mm_unpacklo_epi32(s[0], s[2]);  // k 2, 3
half-tile-forgets-c-between-k-blocks
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^Gemm(Half|F32)\.
      const bool load = accumulate || k0 > 0;
      const bool load = accumulate;
half-pack-transposed-k-tail-misses-a-column
src/toy/backend/cpu/gemm_half.cpp
toy_op_tests
^GemmHalf\.
        for (int i = 0; i < 8; ++i) out[(k - k0) * kNR + jj + i] = col[i * b.j_stride + k];
        for (int i = 0; i < 7; ++i) out[(k - k0) * kNR + jj + i] = col[i * b.j_stride + k];
half-avx2-tile-drops-the-second-sixteen-columns
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^Gemm(Half|F32)\.
      if (cols > 16) t256[size_t(rows - 1)](ai, lda, panel, 16, kc, ci + 16, ldc, cols - 16, load);
      if (cols > 17) t256[size_t(rows - 1)](ai, lda, panel, 16, kc, ci + 16, ldc, cols - 16, load);
half-bf16-widened-as-f16
src/toy/backend/cpu/gemm_half.cpp
toy_op_tests
^GemmHalf\.
    if (b.type == DType::BF16)
    if (false)
half-weight-backward-reads-w-as-the-forward
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^GemmHalf\.
    return gemm_half(N, in, out, gp, out, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), in, 1}, dp, in,
    return gemm_half(N, in, out, gp, out, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), 1, in}, dp, in,
half-weight-prompt-skips-rounding
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^GemmHalf\.
    return gemm_half(N, out, in, xp, in, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), 1, in}, yp, out,
    return gemm_half(N, out, in, x.data<float>(), in, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), 1, in}, yp, out,
rows-panel-decodes-every-k-block-from-the-row-start
src/toy/backend/cpu/gemm_half.cpp
toy_op_tests
^GemmHalf\.
  const size_t skip = row_bytes(w.type, k0);
  const size_t skip = 0;
avx2-block-prompts-back-on-sgemm
src/toy/backend/cpu/matmul_weight.cpp
toy_op_tests
^GemmHalf\.
  if (is_block(w.dtype()))
  if (false && is_block(w.dtype()))
rows-panels-sized-as-halves
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^Gemm(Half|F32)\.
  constexpr int64_t elem = E == Elem::F32 ? 4 : 2;
  constexpr int64_t elem = E == Elem::F32 ? 2 : 2;
half-row-parts-cover-one-row-each
src/toy/backend/cpu/gemm_tiles.h
toy_op_tests
^Gemm(Half|F32)\.
      run(p0, p1, part * part_rows, std::min(M, (part + 1) * part_rows));
      run(p0, p1, part * part_rows, std::min(M, part * part_rows + 1));
f32-pack-a-transposed-k-tail-misses-a-row
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
        for (int q = 0; q < 8; ++q) out[(ii + q) * kPackedLda + kk] = a.p[(k0 + kk) * a.col_stride + i0 + ii + q];
        for (int q = 0; q < 7; ++q) out[(ii + q) * kPackedLda + kk] = a.p[(k0 + kk) * a.col_stride + i0 + ii + q];
f32-pack-a-strided-reads-k-with-the-row-stride
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
      out[ii * kPackedLda + kk] = a.p[(i0 + ii) * a.row_stride + (k0 + kk) * a.col_stride];
      out[ii * kPackedLda + kk] = a.p[(i0 + ii) * a.row_stride + (k0 + kk) * a.row_stride];
f32-panel-transpose-stores-k-rows-reversed
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (k - k0 + q) * kNR + jj, r[q]);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (k - k0 + q) * kNR + jj, r[7 - q]);
f32-panel-copy-drops-the-last-column
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
      std::memcpy(out + (k - k0) * kNR, b.p + k * b.row_stride + j0, size_t(cols) * sizeof(float));
      std::memcpy(out + (k - k0) * kNR, b.p + k * b.row_stride + j0, size_t(cols - 1) * sizeof(float));
f32-row-parts-leave-a-row-out
src/toy/backend/cpu/gemm_f32.cpp
toy_op_tests
^GemmF32\.
        run_part(N, K, a, b, c, ldc, accumulate, 0, panels, t * rows, std::min(M, (t + 1) * rows));
        run_part(N, K, a, b, c, ldc, accumulate, 0, panels, t * rows, std::min(M, (t + 1) * rows - 1));
avx2-weight-gradient-sgemm-ignores-accumulate
src/toy/backend/cpu/matmul.cpp
toy_op_tests
^GemmF32\.
                bp, int(ldb), accumulate ? 1.0f : 0.0f, c + m0 * ldc + n0, int(ldc));
                bp, int(ldb), 0.0f, c + m0 * ldc + n0, int(ldc));
cast-to-bf16-span-rounds-nans-as-numbers
src/toy/backend/cpu/elementwise.cpp
toy_op_tests
^KernelForms\.CastToBf16
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), 16);
    return _mm256_srli_epi32(rounded, 16);
cast-to-bf16-span-keeps-the-pack-lane-order
src/toy/backend/cpu/elementwise.cpp
toy_op_tests
^KernelForms\.CastToBf16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_permute4x64_epi64(packed, 0xd8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
matmul-rounded-reads-a-bf16-operand-as-f32
src/toy/backend/cpu/matmul.cpp
toy_op_tests
^GemmBf16\.
      return Bf16Operand{x.raw_data(), x.dtype() == DType::BF16, x.stride(0), x.stride(1)};
      return Bf16Operand{x.raw_data(), false, x.stride(0), x.stride(1)};
bf16-pack-flushes-f32-subnormals-as-vcvtneps2bf16-does
src/toy/backend/cpu/gemm_bf16.cpp
toy_op_tests
^GemmBf16\.
  if (__builtin_expect(up == 0, 1)) return h;
  return h;
periodic-save-failure-not-annotated
src/toy/train/loop.cpp
toy toy_dist_tests
^DataParallel\.AFailedPeriodicSave
        fail_step(e.what(), "after", st_.step, end_fields);
        throw;
prompts-leave-the-vnni-products
src/toy/backend/cpu/quant_products.cpp
toy_serve_tests
^ServeEngine\.PrefillOfSeveralPrompts
bool quant_products_for_prompts() { return form_in_use() != QuantDot::Avx2; }
bool quant_products_for_prompts() { return false; }
prefill-unchunked
src/toy/serve/engine.cpp
toy_serve_tests
^ServeChunks\.
    prefill_chunks(o_.batch == 0 ? std::numeric_limits<int64_t>::max() : std::max<int64_t>(1, o_.batch - decoding));
    prefill_chunks(std::numeric_limits<int64_t>::max());
prefill-chunks-first-come-first-served
src/toy/serve/engine.cpp
toy_serve_tests
^ServeChunks\.AShortPrompt
    return left(a) != left(b) ? left(a) < left(b) : a->started < b->started;
    return a->started < b->started;
prefill-samples-after-a-partial-chunk
src/toy/serve/engine.cpp
toy_serve_tests
^ServeChunks\.APromptInChunks
    if (s.cached.size() < s.job->params.prompt.size()) return;
    if (false) return;
prefill-ignores-a-cancel
src/toy/serve/engine.cpp
toy_serve_tests
^ServeChunks\.ACancelled
    if (s->job->cancelled()) {\n      release(*s, "cancelled");
    if (false) {\n      release(*s, "cancelled");
prefill-decoding-slots-take-no-budget
src/toy/serve/engine.cpp
toy_serve_tests
^ServeChunks\.
    for (auto& s : slots_) decoding += s->job && !s->prefilling;
    for (auto& s : slots_) decoding += 0;
prefill-positions-ignore-the-cached-prefix
src/toy/models/decoder_lm.cpp
toy_serve_tests toy_model_tests
^(ServeEngine\.Prefill|Decoder\.PublishedArchitectures)
      positions.data<int32_t>()[at] = int32_t(caches[i]->size() + int64_t(t));
      positions.data<int32_t>()[at] = int32_t(t);
attention-prefill-writes-no-cache
src/toy/nn/attention.cpp
toy_serve_tests toy_model_tests
^(ServeEngine\.Prefill|Decoder\.PublishedArchitectures)
    auto [kh, vh] = append(*caches[i], layer, slice(h.k, 1, at, at + T), slice(h.v, 1, at, at + T), h.q.dtype());
    auto [kh, vh] = std::pair{slice(h.k, 1, at, at + T), slice(h.v, 1, at, at + T)};
EOF

# ---- the scratch copy ---------------------------------------------------------------------------
mkdir -p "$scratch/src"
# (Only files whose bytes changed are copied, with a new time: tar would keep each file's own
# time, and a file edited before the scratch copy's last build would then never be rebuilt.)
stage=$(mktemp -d)
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -cf - -T -) | tar -xf - -C "$stage"
python3 - "$stage" "$scratch/src" <<'PY'
import filecmp, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
for dirpath, _, files in os.walk(src):
    for f in files:
        s = os.path.join(dirpath, f)
        d = os.path.join(dst, os.path.relpath(s, src))
        if os.path.islink(s) or not os.path.exists(d) or not filecmp.cmp(s, d, shallow=False):
            os.makedirs(os.path.dirname(d), exist_ok=True)
            if os.path.lexists(d):
                os.remove(d)
            shutil.copy(s, d, follow_symlinks=False)
PY
rm -rf "$stage"
for tool in llamacpp serve-clients; do
  if [ -d "$root/tools/$tool/node_modules" ] && [ ! -e "$scratch/src/tools/$tool/node_modules" ]; then
    ln -s "$root/tools/$tool/node_modules" "$scratch/src/tools/$tool/node_modules"
  fi
done
cmake -S "$scratch/src" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTOY_CUDA=OFF >/dev/null || exit 2
echo "mutants: building the scratch copy in $scratch (the first time is a full build)" >&2
cmake --build "$scratch/build" >/dev/null || { echo "mutants: the unmutated tree does not build" >&2; exit 2; }

# Replaces the one occurrence of FROM with TO in FILE ("\n" = line break); fails unless there
# is exactly one.
apply() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"{text.count(old)} occurrences")
open(path, "w").write(text.replace(old, new))
PY
}

survivors=0
mapfile -t lines <<<"$MUTANTS"
for ((i = 0; i + 5 < ${#lines[@]} + 1; i += 6)); do
  name=${lines[i]} file=${lines[i + 1]} targets=${lines[i + 2]} regex=${lines[i + 3]}
  if [ -n "${TOY_MUTANTS_WHOLE:-}" ]; then targets=all regex=.; fi
  from=${lines[i + 4]} to=${lines[i + 5]}
  if ((${#only[@]})) && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  src="$scratch/src/$file"
  cp -p "$src" "$src.orig"  # the copy's own version (the tree may change while this runs)
  if ! why=$(apply "$src" "$from" "$to" 2>&1); then
    mv "$src.orig" "$src"
    echo "MUTANT $name invalid ($file: $why)"
    survivors=$((survivors + 1))
    continue
  fi
  # shellcheck disable=SC2086
  if ! cmake --build "$scratch/build" --target $targets >/dev/null 2>&1; then
    echo "MUTANT $name invalid (does not build)"
    survivors=$((survivors + 1))
  elif ! ctest --test-dir "$scratch/build" -N -R "$regex" 2>/dev/null | grep -q "Total Tests: [1-9]"; then
    echo "MUTANT $name invalid (no test matches $regex)"
    survivors=$((survivors + 1))
  elif ctest --test-dir "$scratch/build" -R "$regex" --timeout 300 >/dev/null 2>&1; then
    echo "MUTANT $name survived"
    survivors=$((survivors + 1))
  else
    echo "MUTANT $name killed"
  fi
  mv "$src.orig" "$src"
  touch "$src"  # newer than the mutant's object file: the next build recompiles it
done
# Leave the scratch build matching the tree (so the next run is incremental).
cmake --build "$scratch/build" >/dev/null 2>&1
exit $((survivors > 0))
