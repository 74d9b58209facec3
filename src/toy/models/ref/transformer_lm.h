// ref::TransformerLM — the plain-loop reference Transformer language model, kept as an
// ORACLE. It is a faithful port of the original system's first model (seed 000, a Ruby
// `Mat` / `Block` / `TransformerLM`): flat row-major matrices, triple-loop matmuls, and a
// hand-written backward for every layer. The engine's DecoderLM is checked against it on the
// same weights (logits, loss, every gradient, optimizer steps, sampling).
//
// Why a second model at all: the engine model is built from ops, autograd and AVX2/BLAS
// kernels; a parity test against itself would prove nothing. This file depends on nothing
// but the standard library (and toy::Error for reporting caller mistakes) — no Tensor, no
// ops, no threads — so a bug in the engine cannot hide here.
//
// Why double: the oracle's own rounding error must be far below the tolerance the parity
// test grants the F32 engine, and its gradients must agree with central finite differences
// to ~1e-7 relative (tested), which single precision cannot give.
//
// The architecture (seed 000), per block, pre-norm, no biases anywhere:
//   h1     = rms_norm(x, norm1_gamma)                       eps 1e-5, gamma only
//   head_h = softmax(causal((h1·w_q[h]) (h1·w_k[h])ᵀ / sqrt(d_head))) · (h1·w_v[h])
//   x      = x + concat_h(head_h) · w_o
//   h2     = rms_norm(x, norm2_gamma)
//   x      = x + gelu_tanh(h2 · w_ff1) · w_ff2
// then x_final = rms_norm(x, norm_final_gamma) and tied logits = x_final · token_embedᵀ.
// Input: x = token_embed[id] + pos_embed[position] (learned positions).
// Loss: mean cross-entropy over the first T-1 positions, position i predicting token i+1.
//
// Weight layout is the seed's, "input-major": a projection is [in, out] and applied as
// x · W (PyTorch's Linear weight is the transpose). Per-head q/k/v matrices are separate
// [d_model, d_head] matrices; head h owns columns [h*d_head, (h+1)*d_head) of the concat.
//
// Deliberate differences from the seed (each keeps the math, none changes a result the seed
// gets right): the loss is computed as log-sum-exp minus the target logit instead of
// -log(max(p, 1e-12)), so it is exact and never clamped; backward() accumulates (+=) into
// every gradient (the seed overwrote some and accumulated others); init draws from a
// std::mt19937_64 seed instead of Ruby's rand; caller mistakes throw toy::Error.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace toy::ref {

// Constants shared by forward and backward so both agree bit for bit (seed values).
inline constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluK = 0.044715;            // cubic coefficient
inline constexpr double kRmsEps = 1.0e-5;
// Causal-mask score: exp(-1e30 - max) underflows to exactly 0, and unlike -inf it cannot
// produce inf - inf = NaN if a row is shifted by its max.
inline constexpr double kMaskScore = -1.0e30;

// ---- Mat: a 2-D double matrix, flat row-major storage: element (i, j) is flat[i*ncols + j].
struct Mat {
  int64_t nrows = 0;
  int64_t ncols = 0;
  std::vector<double> flat;

  Mat() = default;
  Mat(int64_t nrows, int64_t ncols);  // zero-filled

  double get(int64_t i, int64_t j) const { return flat[size_t(i * ncols + j)]; }
  void set(int64_t i, int64_t j, double v) { flat[size_t(i * ncols + j)] = v; }
  int64_t numel() const { return nrows * ncols; }

  Mat matmul(const Mat& b) const;    // [m, n] · [n, p]   -> [m, p]
  Mat matmul_t(const Mat& b) const;  // [m, n] · [p, n]ᵀ  -> [m, p]
  Mat t_matmul(const Mat& b) const;  // [n, m]ᵀ · [n, p]  -> [m, p]
  Mat transpose() const;             // [m, n] -> [n, m]
  Mat plus(const Mat& b) const;      // elementwise sum, same shape
  Mat& add_(const Mat& b);           // this += b (the seed's add!)
  Mat& scale_(double s);             // this *= s (the seed's scale!)
  void fill_zero();
  // Uniform in [-scale, scale] from rng (53-bit doubles; same numbers on every platform).
  void fill_uniform(std::mt19937_64& rng, double scale);

  std::string shape() const;  // "[5, 768]"
  std::string info() const;   // "Mat[5, 768] min=-2.34 max=1.97 mean=0.012", or "Mat[0, 3] (empty)"
};

// ---- Layers as free functions (each documented with its shapes in the .cpp) ----------------

struct NormResult {
  Mat y;                    // [T, d]
  std::vector<double> rms;  // [T], sqrt(mean(x²) + eps) per row, saved for backward
};
NormResult rms_norm(const Mat& x, const std::vector<double>& gamma, double eps = kRmsEps);
// Returns dx; accumulates (+=) into dgamma.
Mat rms_norm_backward(const Mat& x, const std::vector<double>& gamma, const std::vector<double>& rms,
                      const Mat& dy, std::vector<double>& dgamma);

void softmax_rows_(Mat& m);  // in place, row-wise, max-shifted
Mat softmax_rows_backward(const Mat& softmax_out, const Mat& d_softmax);
// scores[i, j] = kMaskScore for j > query_offset + i.
void apply_causal_mask_(Mat& scores, int64_t query_offset = 0);

double gelu_tanh(double x);
double gelu_tanh_grad(double x);  // d gelu_tanh / dx

struct LossResult {
  Mat dlogits;      // [T, vocab]; row T-1 is zero (nothing to predict there)
  double loss = 0;  // mean over the T-1 predictions; 0 when T < 2
};
// Next-token cross-entropy: row i of logits predicts token_ids[i + 1].
LossResult cross_entropy_grad(const Mat& logits, const std::vector<int32_t>& token_ids);

// Temperature sampling from row `row` of logits [T, vocab]. temperature <= 0: argmax (first
// maximum). Otherwise softmax(logits / temperature) and the first id whose cumulative mass
// exceeds uniform01 * total. uniform01 must lie in [0, 1); it is the caller's random number,
// so the result is a pure function of the arguments.
int32_t sample_logits_row(const Mat& logits, int64_t row, double temperature, double uniform01);

// A uniform double in [0, 1) from 53 bits of rng; what the tests feed sample_logits_row.
double uniform01(std::mt19937_64& rng);

// ---- Model configuration and parameter containers ------------------------------------------

struct Config {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t n_heads = 0;
  int64_t n_layers = 0;
  int64_t context_length = 0;

  int64_t d_head() const { return n_heads > 0 ? d_model / n_heads : 0; }
  // Throws toy::Error unless every size is positive and d_model % n_heads == 0.
  void validate() const;
};

// One transformer block's parameters (or gradients, or Adam moments: same shapes).
struct Block {
  std::vector<double> norm1_gamma;  // [d_model]
  std::vector<double> norm2_gamma;  // [d_model]
  std::vector<Mat> w_q, w_k, w_v;   // n_heads × [d_model, d_head]
  Mat w_o;                          // [d_model, d_model]
  Mat w_ff1;                        // [d_model, d_ff]
  Mat w_ff2;                        // [d_ff, d_model]

  Block() = default;
  explicit Block(const Config& c);  // gammas 1, matrices 0
  void fill_zero();
};

// A named view of one parameter tensor (of a model, a Gradients or an Adam moment).
// Vectors have shape {d}, matrices {rows, cols}; data holds the row-major values.
struct ParamRef {
  std::string name;            // "token_embed", "blocks.1.w_q.0", "blocks.0.norm2_gamma", ...
  std::vector<int64_t> shape;  // {rows, cols} or {d}
  std::vector<double>* data;
};

// Gradients mirror the parameters one for one. token_embed collects both the input lookup
// and the tied unembedding (logits = x_final · token_embedᵀ).
struct Gradients {
  Mat token_embed;                        // [vocab_size, d_model]
  Mat pos_embed;                          // [context_length, d_model]
  std::vector<double> norm_final_gamma;   // [d_model]
  std::vector<Block> blocks;              // n_layers
  double loss = 0;                        // set by TransformerLM::backward

  Gradients() = default;
  explicit Gradients(const Config& c);  // all zero
  void fill_zero();                     // zeroes every gradient and loss
  // Same names and order as TransformerLM::parameters().
  std::vector<ParamRef> parameters();
};

// Adam moments (Gradients-shaped, zero) and the running products bc1 = β1ᵗ, bc2 = β2ᵗ.
struct AdamState {
  Gradients m, v;
  double bc1 = 1.0, bc2 = 1.0;
  int64_t step = 0;

  AdamState() = default;
  explicit AdamState(const Config& c) : m(c), v(c) {}
};

// ---- Activations saved by forward() for backward() -----------------------------------------

struct HeadCache {
  Mat q, k, v;    // [T, d_head]
  Mat attn;       // [T, T], softmax probabilities (masked entries exactly 0)
  Mat head_out;   // [T, d_head] = attn · v
};

struct LayerCache {
  std::vector<double> rms1;  // [T]
  Mat h_norm1;               // [T, d_model], attention input
  std::vector<HeadCache> heads;
  Mat concat;                // [T, d_model], heads side by side
  Mat x_attn;                // [T, d_model], x + attention projection
  std::vector<double> rms2;  // [T]
  Mat h_norm2;               // [T, d_model], FFN input
  Mat ff_pre;                // [T, d_ff], h_norm2 · w_ff1
  Mat ff_hidden;             // [T, d_ff], gelu_tanh(ff_pre)
  Mat x_out;                 // [T, d_model], block output
};

struct ForwardCache {
  std::vector<int32_t> token_ids;
  Mat x_embed;                    // [T, d_model], token + position embeddings
  std::vector<LayerCache> layers;
  Mat x_block_out;                // [T, d_model], last block's output
  std::vector<double> rms_final;  // [T]
  Mat x_final;                    // [T, d_model], after the final RMSNorm
  Mat logits;                     // [T, vocab_size]
};

// ---- The model ---------------------------------------------------------------------------

class TransformerLM {
 public:
  // Weights uniform in [-s, s], s = 1/sqrt(d_model), drawn from std::mt19937_64(seed) in
  // the seed's order (token_embed, pos_embed, then per block: for each head w_q, w_k, w_v;
  // then w_o, w_ff1, w_ff2); all gammas 1. Throws toy::Error for a bad config.
  explicit TransformerLM(const Config& config, uint64_t seed = 0);

  const Config& config() const { return config_; }

  // The parameters, public so a caller can copy weights in and out. Their shapes must stay
  // as constructed (forward() checks them).
  Mat token_embed;                       // [vocab_size, d_model]; also the tied unembedding
  Mat pos_embed;                         // [context_length, d_model]
  std::vector<double> norm_final_gamma;  // [d_model]
  std::vector<Block> blocks;             // n_layers

  // Every parameter tensor by name, in a fixed order shared with Gradients::parameters().
  std::vector<ParamRef> parameters();
  int64_t num_parameters() const;

  // token_ids [T], 1 <= T <= context_length, each in [0, vocab_size). Returns logits
  // [T, vocab_size] and keeps the activations (cache()) for backward().
  Mat forward(const std::vector<int32_t>& token_ids);
  // Backward of the last forward(), which must have been called with the same token_ids.
  // Accumulates (+=) into every gradient in grads (call grads.fill_zero() first unless
  // accumulating over sequences), sets grads.loss and returns the loss. T < 2: loss 0 and
  // no gradient (there is nothing to predict).
  double backward(const std::vector<int32_t>& token_ids, Gradients& grads);
  // forward() + the cross-entropy value, no gradient.
  double loss(const std::vector<int32_t>& token_ids);
  const ForwardCache& cache() const { return cache_; }

  // p -= lr * g.
  void sgd_step(const Gradients& grads, double lr);
  // m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²;  m̂ = m/(1-β1ᵗ);  v̂ = v/(1-β2ᵗ);
  // p -= lr * m̂ / (sqrt(v̂) + eps).
  void adam_step(const Gradients& grads, AdamState& state, double lr, double beta1 = 0.9,
                 double beta2 = 0.999, double eps = 1e-8);

  // Appends max_tokens sampled ids to start_ids (non-empty) and returns the whole list. Each
  // step runs forward() on the last min(len, context_length) tokens and samples the last row
  // with sample_logits_row(..., temperature, uniform01()). uniform01 is only called when
  // temperature > 0 and may be empty otherwise. Overwrites cache().
  std::vector<int32_t> generate_from_ids(const std::vector<int32_t>& start_ids, int64_t max_tokens,
                                         double temperature,
                                         const std::function<double()>& uniform01 = {});

 private:
  void check_tokens(const std::vector<int32_t>& token_ids, const char* where) const;
  void check_param_shapes();
  Mat embed(const std::vector<int32_t>& token_ids) const;
  void transformer_block(const Mat& x, const Block& block, LayerCache& cache) const;
  Mat self_attention(const Mat& h_in, const Block& block, LayerCache& cache) const;
  Mat feed_forward(const Mat& h, const Block& block, LayerCache& cache) const;
  Mat transformer_block_backward(const Mat& dx_out, const Mat& x_in, const Block& block,
                                 const LayerCache& cache, Block& grads) const;
  Mat self_attention_backward(const Mat& d_proj, const LayerCache& cache, const Block& block,
                              Block& grads) const;
  Mat feed_forward_backward(const Mat& d_out, const LayerCache& cache, const Block& block,
                            Block& grads) const;
  void embed_backward(const std::vector<int32_t>& token_ids, const Mat& dx, Gradients& grads) const;

  Config config_;
  ForwardCache cache_;
  bool has_cache_ = false;
};

}  // namespace toy::ref
