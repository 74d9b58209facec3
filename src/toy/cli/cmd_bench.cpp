// `toy bench ops`: hot-path benchmarks, each a ratio against a baseline measured in the same
// run — FMA peak for matmul, the engine's own composed ops for fused attention and the gated
// delta rule, a memcpy of the same bytes for the memory-bound kernels.
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>
#include <memory>

#include "toy/autograd/backward.h"
#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/rng.h"
#include "toy/core/runtime.h"
#include "toy/ops/ops.h"

namespace toy::cli {

void print_result(const BenchResult& r, bool json) {
  if (json) {
    nlohmann::json j = {{"case", r.name},   {"value", r.value},         {"unit", r.unit},
                        {"baseline", r.baseline}, {"ratio", r.ratio}, {"baseline_is", r.baseline_what}};
    if (r.target > 0) j["target"] = r.target;
    std::printf("%s\n", bench_line(j).c_str());
  } else {
    std::printf("%-22s %10.2f %-8s baseline %10.2f (%s)  ratio %.2f%s\n", r.name.c_str(), r.value, r.unit.c_str(),
                r.baseline, r.baseline_what.c_str(), r.ratio,
                r.target > 0 ? (r.ratio >= r.target ? "  [meets target]" : "  [BELOW target]") : "");
  }
  std::fflush(stdout);
}

namespace {

struct OpsBenchOptions {
  bool json = false;
  int reps = 9;
  int threads = 0;
  std::string only;
};

// A product of M x K by K x N taking t seconds, in GFLOP/s against the FMA peak.
BenchResult against_peak(const char* name, int64_t M, int64_t K, int64_t N, double t, double peak,
                         const std::string& peak_what, double target) {
  BenchResult r;
  r.name = name;
  r.value = 2.0 * double(M) * double(N) * double(K) / t / 1e9;
  r.unit = "GFLOP/s";
  r.baseline = peak;
  r.baseline_what = peak_what;
  r.ratio = r.value / peak;
  r.target = target;
  return r;
}

BenchResult bench_matmul(const char* name, int64_t M, int64_t K, int64_t N, double peak, int reps, double target) {
  Generator g(1);
  Tensor a = randn(Shape{M, K}, g), b = randn(Shape{K, N}, g);
  NoGradGuard ng;
  double t = median_seconds([&] { Tensor c = matmul(a, b); }, reps, 2);
  return against_peak(name, M, K, N, t, peak, "FMA peak of this machine", target);
}

BenchResult bench_attention(int reps) {
  const int64_t B = 4, H = 8, T = 256, D = 64;
  Generator g(2);
  Tensor q = randn(Shape{B, T, H, D}, g), k = randn(Shape{B, T, H, D}, g), v = randn(Shape{B, T, H, D}, g);
  Tensor gout = randn(Shape{B, T, H, D}, g);
  q.requires_grad_();
  k.requires_grad_();
  v.requires_grad_();
  auto clear = [&] {
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  };
  auto fused = [&] {
    clear();
    backward(attention(q, k, v), gout);
  };
  auto composed = [&] {
    clear();
    Tensor qh = permute(q, {0, 2, 1, 3}), kh = permute(k, {0, 2, 1, 3}), vh = permute(v, {0, 2, 1, 3});
    Tensor p = softmax(diag_mask_inf(matmul(qh, kh, false, true)), 1.0f / 8.0f);
    backward(permute(matmul(p, vh), {0, 2, 1, 3}), gout);
  };
  auto [tf, tc] = paired_median_seconds(fused, composed, reps, 2, 3);
  BenchResult r;
  r.name = "attention_fwd_bwd";
  r.value = tf * 1e3;
  r.unit = "ms";
  r.baseline = tc * 1e3;
  r.baseline_what = "composed matmul+mask+softmax+matmul, ms";
  r.ratio = tc / tf;
  r.target = 2.0;
  return r;
}

// The gated delta rule, forward + backward at B=4, 8 heads, T=1024, Dk=Dv=64, against the
// same recurrence composed from the engine's own ops token by token (batched over B and the
// heads: 8 ops a token, each with its tape node).
BenchResult bench_gated_delta(int reps) {
  const int64_t B = 4, H = 8, T = 1024, D = 64;
  Generator gen(4);
  Tensor q = l2_norm(randn(Shape{B, T, H, D}, gen)), k = l2_norm(randn(Shape{B, T, H, D}, gen));
  Tensor v = randn(Shape{B, T, H, D}, gen), gout = randn(Shape{B, T, H, D}, gen);
  Tensor g = scale(sigmoid(randn(Shape{B, T, H}, gen)), -0.5f), beta = sigmoid(randn(Shape{B, T, H}, gen));
  for (Tensor* t : {&q, &k, &v, &g, &beta}) t->requires_grad_();
  auto clear = [&] {
    for (Tensor* t : {&q, &k, &v, &g, &beta}) t->zero_grad();
  };
  auto fused = [&] {
    clear();
    backward(gated_delta_rule(q, k, v, g, beta).first, gout);
  };
  auto composed = [&] {
    clear();
    Tensor S = zeros(Shape{B, H, D, D});
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < T; ++t) {
      auto at = [&](const Tensor& x) { return slice(x, 1, t, t + 1); };  // [B, 1, H, ...]
      Tensor kt = reshape(at(k), Shape{B, H, D, 1}), qt = reshape(at(q), Shape{B, H, 1, D});
      Tensor vt = reshape(at(v), Shape{B, H, 1, D});
      S = mul(S, reshape(exp(at(g)), Shape{B, H, 1, 1}));
      Tensor p = matmul(transpose(kt, 2, 3), S);                                   // [B, H, 1, D]
      Tensor u = mul(reshape(at(beta), Shape{B, H, 1, 1}), sub(vt, p));
      S = add(S, matmul(kt, u));
      outs.push_back(reshape(matmul(qt, S), Shape{B, 1, H, D}));
    }
    backward(concat(outs, 1), gout);
  };
  auto [tf, tc] = paired_median_seconds(fused, composed, reps, 1);
  BenchResult r;
  r.name = "gated_delta_rule";
  r.value = tf * 1e3;
  r.unit = "ms";
  r.baseline = tc * 1e3;
  r.baseline_what = "the recurrence composed from engine ops token by token, fwd+bwd, ms";
  r.ratio = tc / tf;
  r.target = 10.0;
  return r;
}

// Forward only (a prefill): the chunked form's tokens/s against the token-by-token form's.
BenchResult bench_gated_delta_prefill(int reps) {
  const int64_t B = 4, H = 8, T = 1024, D = 64;
  Generator gen(5);
  Tensor q = l2_norm(randn(Shape{B, T, H, D}, gen)), k = l2_norm(randn(Shape{B, T, H, D}, gen));
  Tensor v = randn(Shape{B, T, H, D}, gen);
  Tensor g = scale(sigmoid(randn(Shape{B, T, H}, gen)), -0.5f), beta = sigmoid(randn(Shape{B, T, H}, gen));
  NoGradGuard ng;
  auto run = [&](GatedDeltaAlgorithm a) { return [&, a] { gated_delta_rule(q, k, v, g, beta, Tensor(), a); }; };
  auto [tc, tr] = paired_median_seconds(run(GatedDeltaAlgorithm::Chunked), run(GatedDeltaAlgorithm::Recurrent), reps, 1);
  BenchResult r;
  r.name = "gated_delta_rule_prefill";
  r.value = double(B * T) / tc;
  r.unit = "tok/s";
  r.baseline = double(B * T) / tr;
  r.baseline_what = "the token-by-token form, tok/s";
  r.ratio = tr / tc;
  return r;
}

// A row-wise or elementwise kernel on [4096, 4096] f32 (rms_norm, softmax, silu, gelu with
// the tanh approximation, swiglu of the packed gate|up halves) against a memcpy of x on the
// same threads, each as bytes moved per second (swiglu writes half what it reads). The two
// are timed alternately so that both see the same machine (memory bandwidth on shared hosts
// drifts by 2x over minutes).
BenchResult bench_rowwise(const std::string& name, int reps) {
  const int64_t R = 4096, D = 4096;
  Generator g(3);
  Tensor x = randn(Shape{R, D}, g), w = randn(Shape{D}, g);
  const size_t bytes = size_t(R * D) * 4;
  std::unique_ptr<char[]> dst(new char[bytes]);
  std::memset(dst.get(), 0, bytes);
  const char* src = static_cast<const char*>(x.raw_data());
  NoGradGuard ng;
  auto kernel = [&] {
    Tensor y = name == "rms_norm" ? rms_norm(x, w) : name == "softmax" ? softmax(x)
             : name == "silu"     ? silu(x)      : name == "swiglu"  ? swiglu(x) : gelu(x, GeluApprox::Tanh);
  };
  auto copy = [&] { host::parallel_copy(dst.get(), src, bytes); };
  auto [t, mt] = paired_median_seconds(kernel, copy, reps, 1);
  const double moved = (name == "swiglu" ? 1.5 : 2.0) * double(bytes);  // read x, write y
  BenchResult r;
  r.name = name;
  r.value = moved / t / 1e9;
  r.unit = "GB/s";
  r.baseline = 2.0 * double(bytes) / mt / 1e9;
  r.baseline_what = "memcpy of x on the same threads, GB/s";
  r.ratio = r.value / r.baseline;
  r.target = 0.90;
  return r;
}

// AdamW on 16M parameters (the arrays well past every cache: it is bound by memory) against
// a memcpy moving as many bytes (it reads the parameter, gradient and both moments and writes
// three of them: 7 x 64 MiB), timed alternately as bench_rowwise does.
BenchResult bench_adamw(int reps) {
  const int64_t n = int64_t(16) << 20;
  Generator gen(4);
  Tensor p = randn(Shape{n}, gen), g = randn(Shape{n}, gen), m = zeros(Shape{n}), v = zeros(Shape{n});
  const Tensor lr = scalar(1e-3), step = scalar(1.0);
  const size_t bytes = size_t(n) * 4 * 7 / 2;  // read + written = 7 arrays
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  NoGradGuard ng;
  auto kernel = [&] { adamw_step(p, g, m, v, lr, step, AdamWOptions{0.9f, 0.95f, 1e-8f, 0.1f}); };
  auto copy = [&] { host::parallel_copy(dst.get(), src.get(), bytes); };
  auto [t, mt] = paired_median_seconds(kernel, copy, reps, 1);
  BenchResult r;
  r.name = "adamw";
  r.value = 2.0 * double(bytes) / t / 1e9;
  r.unit = "GB/s";
  r.baseline = 2.0 * double(bytes) / mt / 1e9;
  r.baseline_what = "memcpy of as many bytes on the same threads, GB/s";
  r.ratio = mt / t;
  r.target = 0.90;
  return r;
}

// A BF16 weight's product with 1024 rows of f32 activations (a prompt), 1024^3, against the
// f32 FMA peak: what the CPU's BF16 products (AMX, vdpbf16ps) give beyond f32 arithmetic.
BenchResult bench_bf16_weight(double peak, int reps) {
  const int64_t n = 1024;
  Generator gen(6);
  const Tensor x = randn(Shape{n, n}, gen), w = cast(randn(Shape{n, n}, gen), DType::BF16);
  NoGradGuard ng;
  const double t = median_seconds([&] { Tensor y = linear(x, w); }, reps, 2);
  return against_peak("linear_bf16_weight_1024", n, n, n, t, peak,
                      "f32 FMA peak of this machine; bf16 products: " + bf16_products_form(), 0);
}

// An F16 weight's product with a prompt of 512 rows (SmolLM2-135M's MLP up: 576 -> 1536),
// against the f32 FMA peak: gemm_half widens the weight in registers, at FMA speed or not.
BenchResult bench_f16_weight(double peak, int reps) {
  const int64_t rows = 512, in = 576, out = 1536;
  Generator gen(7);
  const Tensor x = randn(Shape{rows, in}, gen), w = cast(randn(Shape{out, in}, gen), DType::F16);
  NoGradGuard ng;
  const double t = median_seconds([&] { Tensor y = linear(x, w); }, reps * 4, 2);
  return against_peak("linear_f16_weight_prompt", rows, in, out, t, peak, "FMA peak of this machine", 0.6);
}

// A projection's forward and backward in mixed precision (BF16 products over an F32 master,
// as `--precision bf16` trains) against the same in f32: a batch of 8 x 512 tokens of width
// 384 through a 1536-wide layer (cpu-small's MLP).
BenchResult bench_linear_bf16(int reps) {
  const int64_t T = 4096, D = 384, F = 1536;
  Generator gen(5);
  Tensor x = randn(Shape{T, D}, gen), w = randn(Shape{F, D}, gen, 0.0f, 0.05f), g = randn(Shape{T, F}, gen);
  x.requires_grad_();
  w.requires_grad_();
  auto step = [&](bool bf16) {
    x.zero_grad();
    w.zero_grad();
    backward(linear(x, bf16 ? cast(w, DType::BF16) : w), g);
  };
  auto [t, ft] = paired_median_seconds([&] { step(true); }, [&] { step(false); }, reps, 1);
  const double flops = 6.0 * double(T) * double(D) * double(F);
  BenchResult r;
  r.name = "linear_bf16_fwd_bwd";
  r.value = flops / t / 1e9;
  r.unit = "GFLOP/s";
  r.baseline = flops / ft / 1e9;
  r.baseline_what = std::string("the f32 linear, GFLOP/s; bf16 products: ") + bf16_products_form();
  r.ratio = ft / t;
  r.target = 1.3;
  return r;
}

// cpu-small's four projections (qkv 128 -> 384, attention out 128 -> 128, MLP 128 -> 512 and
// 512 -> 128) over its 768 tokens, forward and backward (dx, dW, db): the products a training
// step spends most of its time in, three orientations of each (x W^T, g W, g^T x).
BenchResult bench_linear_f32_train(double peak, int reps) {
  const int64_t T = 768;
  const int64_t shapes[][2] = {{128, 384}, {128, 128}, {128, 512}, {512, 128}};  // {in, out}
  Generator gen(6);
  std::vector<Tensor> xs, ws, bs, gs;
  double flops = 0;
  for (const auto& s : shapes) {
    xs.push_back(randn(Shape{T, s[0]}, gen));
    ws.push_back(randn(Shape{s[1], s[0]}, gen, 0.0f, 0.05f));
    bs.push_back(randn(Shape{s[1]}, gen));
    gs.push_back(randn(Shape{T, s[1]}, gen));
    xs.back().requires_grad_();
    ws.back().requires_grad_();
    bs.back().requires_grad_();
    flops += 6.0 * double(T) * double(s[0]) * double(s[1]);
  }
  auto step = [&] {
    for (size_t i = 0; i < xs.size(); ++i) {
      xs[i].zero_grad();
      ws[i].zero_grad();
      bs[i].zero_grad();
      backward(linear(xs[i], ws[i], bs[i]), gs[i]);
    }
  };
  const double t = median_seconds(step, reps, 2);
  BenchResult r;
  r.name = "linear_f32_train";
  r.value = flops / t / 1e9;
  r.unit = "GFLOP/s";
  r.baseline = peak;
  r.baseline_what = "FMA peak of this machine";
  r.ratio = r.value / peak;
  r.target = 0.55;
  return r;
}

int run_ops_bench(const OpsBenchOptions& o) {
  if (o.threads) set_num_threads(o.threads);
  const int threads = num_threads();
  auto want = [&](const char* n) { return o.only.empty() || o.only == n; };
  const double peak = host::fma_peak_gflops(threads, 0.25);
  print_result({"fma_peak", peak, "GFLOP/s", peak, 1.0,
                "itself (" + std::to_string(threads) + " threads, " + cpu_label() + ")", 0},
               o.json);
  if (want("matmul_f32_1024")) print_result(bench_matmul("matmul_f32_1024", 1024, 1024, 1024, peak, o.reps, 0.60), o.json);
  if (want("matmul_f32_train"))
    print_result(bench_matmul("matmul_f32_train", 768, 128, 512, peak, o.reps * 5, 0.40), o.json);
  if (want("linear_f32_train")) print_result(bench_linear_f32_train(peak, o.reps * 5), o.json);
  if (want("attention_fwd_bwd")) print_result(bench_attention(o.reps * 2), o.json);
  for (const char* rowwise : {"rms_norm", "softmax", "silu", "gelu", "swiglu"})
    if (want(rowwise)) print_result(bench_rowwise(rowwise, o.reps * 2), o.json);
  if (want("adamw")) print_result(bench_adamw(o.reps), o.json);
  if (want("linear_bf16_fwd_bwd")) print_result(bench_linear_bf16(o.reps), o.json);
  if (want("linear_bf16_weight_1024")) print_result(bench_bf16_weight(peak, o.reps), o.json);
  if (want("linear_f16_weight_prompt")) print_result(bench_f16_weight(peak, o.reps), o.json);
  if (want("gated_delta_rule")) print_result(bench_gated_delta(std::max(1, o.reps / 3)), o.json);
  if (want("gated_delta_rule_prefill")) print_result(bench_gated_delta_prefill(o.reps), o.json);
  return 0;
}

}  // namespace

// `toy bench train` lives in bench_train.cpp, `toy bench run` in bench_run.cpp, `toy bench
// finetune` in bench_finetune.cpp, `toy bench vision` in bench_vision.cpp, `toy bench serve` in
// bench_serve.cpp, `toy bench structured` in bench_structured.cpp.
Run add_bench_train_command(CLI::App& bench);
Run add_bench_run_command(CLI::App& bench);
Run add_bench_finetune_command(CLI::App& bench);
Run add_bench_vision_command(CLI::App& bench);
Run add_bench_serve_command(CLI::App& bench);
Run add_bench_structured_command(CLI::App& bench);

Run add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmarks with ratios against baselines measured in the same run");
  cmd->require_subcommand(1);
  auto* ops = cmd->add_subcommand("ops", "Op kernels: matmul vs FMA peak, fused attention vs composed, norms vs memcpy");
  auto o = std::make_shared<OpsBenchOptions>();
  ops->add_flag("--json", o->json, "One JSON object per line");
  add_int(ops, "--reps", o->reps, 1, 1000, "Timed repetitions per case (median reported)");
  add_int(ops, "--threads", o->threads, 1, kMaxThreads, "Threads (default: all cores)")->default_str("");
  ops->add_option("--case", o->only, "Run one case only");
  Run train = add_bench_train_command(*cmd);
  CLI::App* train_cmd = cmd->get_subcommand("train");
  Run run = add_bench_run_command(*cmd);
  CLI::App* run_cmd = cmd->get_subcommand("run");
  Run finetune = add_bench_finetune_command(*cmd);
  CLI::App* finetune_cmd = cmd->get_subcommand("finetune");
  Run vision = add_bench_vision_command(*cmd);
  CLI::App* vision_cmd = cmd->get_subcommand("vision");
  Run serve = add_bench_serve_command(*cmd);
  CLI::App* serve_cmd = cmd->get_subcommand("serve");
  Run structured = add_bench_structured_command(*cmd);
  CLI::App* structured_cmd = cmd->get_subcommand("structured");
  return [ops, o, train, train_cmd, run, run_cmd, finetune, finetune_cmd, vision, vision_cmd, serve, serve_cmd,
          structured, structured_cmd]() -> int {
    if (ops->parsed()) return run_ops_bench(*o);
    if (train_cmd->parsed()) return train();
    if (run_cmd->parsed()) return run();
    if (finetune_cmd->parsed()) return finetune();
    if (vision_cmd->parsed()) return vision();
    if (serve_cmd->parsed()) return serve();
    if (structured_cmd->parsed()) return structured();
    return 1;
  };
}

}  // namespace toy::cli
