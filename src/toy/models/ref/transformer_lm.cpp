// ref::TransformerLM: plain loops in double, the oracle for the engine model. See the header
// for what it computes and why. Every loop keeps the seed's summation order, so the numbers
// are reproducible to the last bit on any machine (no threads, no FMA contraction: the
// project builds with -std=c++20, not gnu++20).
#include "toy/models/ref/transformer_lm.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "toy/core/error.h"

namespace toy::ref {

namespace {

// Ruby's Float#to_s, so Mat::info() prints what the seed printed: the shortest digits that
// round-trip, fixed notation with at least one decimal ("1.0", "0.012") when the decimal
// exponent e is in [-4, 15], else "1.5e-05" / "1.0e+16".
std::string ruby_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e-05"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t epos = sci.find('e');
  int e = std::atoi(sci.c_str() + epos + 1);
  std::string digits;  // significant digits without the point: "12345"
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];

  if (e >= -4 && e <= 15) {
    std::string s;
    if (e < 0) {
      s = "0." + std::string(size_t(-e - 1), '0') + digits;
    } else {
      std::string ip = digits.substr(0, std::min(digits.size(), size_t(e + 1)));
      ip.append(size_t(e + 1) - ip.size(), '0');
      std::string fp = digits.size() > size_t(e + 1) ? digits.substr(size_t(e + 1)) : "0";
      s = ip + "." + fp;
    }
    return sign + s;
  }
  std::string mant = digits.substr(0, 1) + "." + (digits.size() > 1 ? digits.substr(1) : "0");
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%+03d", e);
  return sign + mant + ebuf;
}

std::string shape_str(int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; }

}  // namespace

// ================================================================================= Mat ====

Mat::Mat(int64_t r, int64_t c) : nrows(r), ncols(c) {
  TOY_CHECK(r >= 0 && c >= 0, "[ref::Mat] dimensions must be >= 0, got {}", shape_str(r, c));
  flat.assign(size_t(r * c), 0.0);
}

namespace {
// out[i, j] = sum_k a(i, k) * b(k, j) over k < n, one accumulator per output, k innermost
// (the seed's order). a and b read the operands in whatever layout the caller has.
template <class A, class B>
Mat product(int64_t m, int64_t n, int64_t p, A a, B b) {
  Mat out(m, p);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < p; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += a(i, k) * b(k, j);
      out.flat[size_t(i * p + j)] = s;
    }
  return out;
}
}  // namespace

// a [m, n] · b [n, p] -> [m, p].
Mat Mat::matmul(const Mat& b) const {
  TOY_CHECK(ncols == b.nrows, "[ref::Mat::matmul] inner dims differ: a {} vs b {}", shape(), b.shape());
  const int64_t n = ncols, p = b.ncols;
  return product(nrows, n, p, [&](int64_t i, int64_t k) { return flat[size_t(i * n + k)]; },
                 [&](int64_t k, int64_t j) { return b.flat[size_t(k * p + j)]; });
}

// a [m, n] · (b [p, n])ᵀ -> [m, p]: dot products of rows with rows.
Mat Mat::matmul_t(const Mat& b) const {
  TOY_CHECK(ncols == b.ncols, "[ref::Mat::matmul_t] column counts differ: a {} vs b {}", shape(), b.shape());
  const int64_t n = ncols;
  return product(nrows, n, b.nrows, [&](int64_t i, int64_t k) { return flat[size_t(i * n + k)]; },
                 [&](int64_t k, int64_t j) { return b.flat[size_t(j * n + k)]; });
}

// (a [n, m])ᵀ · b [n, p] -> [m, p]: the weight-gradient shape (inputsᵀ · output grads).
Mat Mat::t_matmul(const Mat& b) const {
  TOY_CHECK(nrows == b.nrows, "[ref::Mat::t_matmul] row counts differ: a {} vs b {}", shape(), b.shape());
  const int64_t m = ncols, p = b.ncols;
  return product(m, nrows, p, [&](int64_t i, int64_t k) { return flat[size_t(k * m + i)]; },
                 [&](int64_t k, int64_t j) { return b.flat[size_t(k * p + j)]; });
}

// [m, n] -> [n, m]
Mat Mat::transpose() const {
  Mat out(ncols, nrows);
  for (int64_t i = 0; i < nrows; ++i)
    for (int64_t j = 0; j < ncols; ++j) out.flat[size_t(j * nrows + i)] = flat[size_t(i * ncols + j)];
  return out;
}

// [m, n] + [m, n] -> [m, n]
Mat Mat::plus(const Mat& b) const {
  TOY_CHECK(nrows == b.nrows && ncols == b.ncols, "[ref::Mat::plus] shapes differ: a {} vs b {}", shape(),
            b.shape());
  Mat out(nrows, ncols);
  for (size_t i = 0; i < flat.size(); ++i) out.flat[i] = flat[i] + b.flat[i];
  return out;
}

Mat& Mat::add_(const Mat& b) {
  TOY_CHECK(nrows == b.nrows && ncols == b.ncols, "[ref::Mat::add_] shapes differ: a {} vs b {}", shape(),
            b.shape());
  for (size_t i = 0; i < flat.size(); ++i) flat[i] += b.flat[i];
  return *this;
}

Mat& Mat::scale_(double s) {
  for (double& v : flat) v *= s;
  return *this;
}

void Mat::fill_zero() { std::fill(flat.begin(), flat.end(), 0.0); }

void Mat::fill_uniform(std::mt19937_64& rng, double scale) {
  for (double& v : flat) v = (2.0 * uniform01(rng) - 1.0) * scale;
}

std::string Mat::shape() const { return shape_str(nrows, ncols); }

std::string Mat::info() const {
  if (flat.empty()) return "Mat" + shape() + " (empty)";
  double mn = flat[0], mx = flat[0], sum = 0.0;
  for (double v : flat) {
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
  }
  double mean = sum / double(flat.size());
  return "Mat" + shape() + " min=" + ruby_float(mn) + " max=" + ruby_float(mx) + " mean=" + ruby_float(mean);
}

double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

// ============================================================================== layers ====

// x [T, d], gamma [d] -> y [T, d] = gamma * x / r, r = sqrt(mean(x²) + eps) per row; rms [T].
NormResult rms_norm(const Mat& x, const std::vector<double>& gamma, double eps) {
  const int64_t t = x.nrows, d = x.ncols;
  TOY_CHECK(int64_t(gamma.size()) == d, "[ref::rms_norm] gamma has {} values, expected {} (x {})",
            gamma.size(), d, x.shape());
  NormResult res{Mat(t, d), std::vector<double>(size_t(t))};
  for (int64_t i = 0; i < t; ++i) {
    const double* xr = &x.flat[size_t(i * d)];
    double sumsq = 0.0;
    for (int64_t j = 0; j < d; ++j) sumsq += xr[j] * xr[j];
    double r = std::sqrt(sumsq / double(d) + eps);
    res.rms[size_t(i)] = r;
    for (int64_t j = 0; j < d; ++j) res.y.flat[size_t(i * d + j)] = xr[j] * gamma[size_t(j)] / r;
  }
  return res;
}

// x [T, d], gamma [d], rms [T], dy [T, d] -> dx [T, d]; dgamma [d] += Σ_rows dy * x / r.
// With y_k = g_k x_k / r and dr/dx_k = x_k / (d r):
//   dx_k = (dy_k g_k - x_k * coef) / r,   coef = Σ_j dy_j g_j x_j / (d r²).
Mat rms_norm_backward(const Mat& x, const std::vector<double>& gamma, const std::vector<double>& rms,
                      const Mat& dy, std::vector<double>& dgamma) {
  const int64_t t = x.nrows, d = x.ncols;
  Mat dx(t, d);
  for (int64_t i = 0; i < t; ++i) {
    const double r = rms[size_t(i)];
    double inner = 0.0;
    for (int64_t j = 0; j < d; ++j) inner += dy.get(i, j) * gamma[size_t(j)] * x.get(i, j);
    const double coef = inner / (double(d) * r * r);
    for (int64_t j = 0; j < d; ++j) {
      dx.set(i, j, (dy.get(i, j) * gamma[size_t(j)] - x.get(i, j) * coef) / r);
      dgamma[size_t(j)] += dy.get(i, j) * x.get(i, j) / r;
    }
  }
  return dx;
}

// m [T, n] in place: each row -> exp(row - max) / Σ exp(row - max).
void softmax_rows_(Mat& m) {
  const int64_t t = m.nrows, n = m.ncols;
  for (int64_t i = 0; i < t; ++i) {
    double* row = &m.flat[size_t(i * n)];
    double mx = row[0];
    for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < n; ++j) row[j] /= sum;
  }
}

// softmax_out [T, n], d_softmax [T, n] -> d_scores [T, n] = p * (dp - Σ_k p_k dp_k) per row.
Mat softmax_rows_backward(const Mat& p, const Mat& dp) {
  const int64_t t = p.nrows, n = p.ncols;
  Mat out(t, n);
  for (int64_t i = 0; i < t; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s += p.get(i, j) * dp.get(i, j);
    for (int64_t j = 0; j < n; ++j) out.set(i, j, p.get(i, j) * (dp.get(i, j) - s));
  }
  return out;
}

// scores [T, n]: query i (absolute position query_offset + i) may not see keys after itself.
void apply_causal_mask_(Mat& scores, int64_t query_offset) {
  for (int64_t i = 0; i < scores.nrows; ++i)
    for (int64_t j = query_offset + i + 1; j < scores.ncols; ++j) scores.set(i, j, kMaskScore);
}

// gelu(x) = 0.5 x (1 + tanh(u)),  u = C (x + K x³)   (GPT-2's tanh approximation)
double gelu_tanh(double x) {
  double u = kGeluC * (x + kGeluK * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t²) C (1 + 3K x²),  t = tanh(u)
double gelu_tanh_grad(double x) {
  double t = std::tanh(kGeluC * (x + kGeluK * x * x * x));
  double du_dx = kGeluC * (1.0 + 3.0 * kGeluK * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx;
}

// logits [T, V], token_ids [T] -> dlogits [T, V] and the mean loss over rows 0..T-2.
// Row i: p = softmax(logits[i]); loss_i = log Σ exp(l - max) - (l[target] - max), which is
// -log p[target] without the seed's 1e-12 floor (exact, and consistent with the gradient);
// dlogits[i] = (p - onehot(target)) / (T-1).
LossResult cross_entropy_grad(const Mat& logits, const std::vector<int32_t>& token_ids) {
  const int64_t t = logits.nrows, v = logits.ncols;
  TOY_CHECK(int64_t(token_ids.size()) == t, "[ref::cross_entropy_grad] {} token ids for logits {}",
            token_ids.size(), logits.shape());
  LossResult res{Mat(t, v), 0.0};
  const int64_t n_pred = t - 1;
  if (n_pred <= 0) return res;
  const double inv_n = 1.0 / double(n_pred);
  double total = 0.0;
  for (int64_t i = 0; i < n_pred; ++i) {
    const int32_t target = token_ids[size_t(i + 1)];
    TOY_CHECK(target >= 0 && target < v,
              "[ref::cross_entropy_grad] target id {} at position {} out of range: expected 0 <= id < {}",
              target, i + 1, v);
    const double* row = &logits.flat[size_t(i * v)];
    double mx = row[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    total += std::log(sum) - (row[target] - mx);
    for (int64_t j = 0; j < v; ++j) res.dlogits.set(i, j, std::exp(row[j] - mx) / sum * inv_n);
    res.dlogits.flat[size_t(i * v + target)] -= inv_n;
  }
  res.loss = total / double(n_pred);
  return res;
}

// logits [T, V] -> token id from row `row` (see the header).
int32_t sample_logits_row(const Mat& logits, int64_t row, double temperature, double u) {
  const int64_t v = logits.ncols;
  TOY_CHECK(row >= 0 && row < logits.nrows && v > 0, "[ref::sample_logits_row] row {} out of range for logits {}",
            row, logits.shape());
  const double* l = &logits.flat[size_t(row * v)];
  if (temperature <= 0.0) {
    int64_t best = 0;  // first maximum wins, like the seed's strict '>'
    for (int64_t j = 1; j < v; ++j)
      if (l[j] > l[best]) best = j;
    return int32_t(best);
  }
  TOY_CHECK(u >= 0.0 && u < 1.0, "[ref::sample_logits_row] uniform number must be in [0, 1), got {}", u);
  const double inv_t = 1.0 / temperature;
  double mx = l[0];
  for (int64_t j = 1; j < v; ++j) mx = std::max(mx, l[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < v; ++j) sum += std::exp((l[j] - mx) * inv_t);
  const double r = u * sum;
  double cum = 0.0;
  for (int64_t j = 0; j < v; ++j) {
    cum += std::exp((l[j] - mx) * inv_t);
    if (r < cum) return int32_t(j);
  }
  return int32_t(v - 1);  // only reachable through rounding in the running sum
}

// ============================================================ config and containers ====

void Config::validate() const {
  TOY_CHECK(vocab_size > 0 && d_model > 0 && d_ff > 0 && n_heads > 0 && n_layers > 0 && context_length > 0,
            "[ref::TransformerLM] every size must be positive, got vocab_size {} d_model {} d_ff {} n_heads {} "
            "n_layers {} context_length {}",
            vocab_size, d_model, d_ff, n_heads, n_layers, context_length);
  TOY_CHECK(d_model % n_heads == 0,
            "[ref::TransformerLM] d_model must be divisible by n_heads: d_model {} is not a multiple of n_heads {}",
            d_model, n_heads);
}

Block::Block(const Config& c)
    : norm1_gamma(size_t(c.d_model), 1.0),
      norm2_gamma(size_t(c.d_model), 1.0),
      w_q(size_t(c.n_heads), Mat(c.d_model, c.d_head())),
      w_k(size_t(c.n_heads), Mat(c.d_model, c.d_head())),
      w_v(size_t(c.n_heads), Mat(c.d_model, c.d_head())),
      w_o(c.d_model, c.d_model),
      w_ff1(c.d_model, c.d_ff),
      w_ff2(c.d_ff, c.d_model) {}

void Block::fill_zero() {
  std::fill(norm1_gamma.begin(), norm1_gamma.end(), 0.0);
  std::fill(norm2_gamma.begin(), norm2_gamma.end(), 0.0);
  for (auto* heads : {&w_q, &w_k, &w_v})
    for (Mat& m : *heads) m.fill_zero();
  w_o.fill_zero();
  w_ff1.fill_zero();
  w_ff2.fill_zero();
}

namespace {

// The one parameter inventory, shared by the model and Gradients (same member names), so
// names and order can never drift apart.
template <class P>
std::vector<ParamRef> collect_params(P& p) {
  std::vector<ParamRef> out;
  auto mat = [&](std::string name, Mat& m) { out.push_back({std::move(name), {m.nrows, m.ncols}, &m.flat}); };
  auto vec = [&](std::string name, std::vector<double>& v) {
    out.push_back({std::move(name), {int64_t(v.size())}, &v});
  };
  mat("token_embed", p.token_embed);
  mat("pos_embed", p.pos_embed);
  for (size_t l = 0; l < p.blocks.size(); ++l) {
    Block& b = p.blocks[l];
    const std::string pre = "blocks." + std::to_string(l) + ".";
    vec(pre + "norm1_gamma", b.norm1_gamma);
    for (size_t h = 0; h < b.w_q.size(); ++h) mat(pre + "w_q." + std::to_string(h), b.w_q[h]);
    for (size_t h = 0; h < b.w_k.size(); ++h) mat(pre + "w_k." + std::to_string(h), b.w_k[h]);
    for (size_t h = 0; h < b.w_v.size(); ++h) mat(pre + "w_v." + std::to_string(h), b.w_v[h]);
    mat(pre + "w_o", b.w_o);
    vec(pre + "norm2_gamma", b.norm2_gamma);
    mat(pre + "w_ff1", b.w_ff1);
    mat(pre + "w_ff2", b.w_ff2);
  }
  vec("norm_final_gamma", p.norm_final_gamma);
  return out;
}

}  // namespace

Gradients::Gradients(const Config& c)
    : token_embed(c.vocab_size, c.d_model),
      pos_embed(c.context_length, c.d_model),
      norm_final_gamma(size_t(c.d_model), 0.0),
      blocks(size_t(c.n_layers), Block(c)) {
  for (Block& b : blocks) b.fill_zero();  // Block(c) starts gammas at 1, gradients start at 0
}

void Gradients::fill_zero() {
  token_embed.fill_zero();
  pos_embed.fill_zero();
  std::fill(norm_final_gamma.begin(), norm_final_gamma.end(), 0.0);
  for (Block& b : blocks) b.fill_zero();
  loss = 0.0;
}

std::vector<ParamRef> Gradients::parameters() { return collect_params(*this); }

// =============================================================================== model ====

TransformerLM::TransformerLM(const Config& config, uint64_t seed) : config_(config) {
  config_.validate();
  const Config& c = config_;
  std::mt19937_64 rng(seed);
  const double s = 1.0 / std::sqrt(double(c.d_model));

  token_embed = Mat(c.vocab_size, c.d_model);
  token_embed.fill_uniform(rng, s);
  pos_embed = Mat(c.context_length, c.d_model);
  pos_embed.fill_uniform(rng, s);
  norm_final_gamma.assign(size_t(c.d_model), 1.0);
  blocks.assign(size_t(c.n_layers), Block(c));
  for (Block& b : blocks) {
    for (int64_t h = 0; h < c.n_heads; ++h) {  // the seed's interleaved order
      b.w_q[size_t(h)].fill_uniform(rng, s);
      b.w_k[size_t(h)].fill_uniform(rng, s);
      b.w_v[size_t(h)].fill_uniform(rng, s);
    }
    b.w_o.fill_uniform(rng, s);
    b.w_ff1.fill_uniform(rng, s);
    b.w_ff2.fill_uniform(rng, s);
  }
}

std::vector<ParamRef> TransformerLM::parameters() { return collect_params(*this); }

int64_t TransformerLM::num_parameters() const {
  const Config& c = config_;
  const int64_t per_block = 2 * c.d_model + 3 * c.d_model * c.d_model + c.d_model * c.d_model + 2 * c.d_model * c.d_ff;
  return c.vocab_size * c.d_model + c.context_length * c.d_model + c.d_model + c.n_layers * per_block;
}

void TransformerLM::check_tokens(const std::vector<int32_t>& ids, const char* where) const {
  TOY_CHECK(!ids.empty(), "[ref::TransformerLM::{}] expected at least 1 token id, got 0", where);
  TOY_CHECK(int64_t(ids.size()) <= config_.context_length,
            "[ref::TransformerLM::{}] sequence of {} tokens is longer than context_length {}", where, ids.size(),
            config_.context_length);
  for (size_t i = 0; i < ids.size(); ++i)
    TOY_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size,
              "[ref::TransformerLM::{}] token id {} at position {} is out of range: expected 0 <= id < "
              "vocab_size {}",
              where, ids[i], i, config_.vocab_size);
}

// The members are public (so weights can be copied in); catch a wrongly sized copy here
// instead of reading out of bounds.
void TransformerLM::check_param_shapes() {
  const Config& c = config_;
  TOY_CHECK(int64_t(blocks.size()) == c.n_layers, "[ref::TransformerLM] {} blocks, expected n_layers {}",
            blocks.size(), c.n_layers);
  for (const Block& b : blocks)
    TOY_CHECK(int64_t(b.w_q.size()) == c.n_heads && int64_t(b.w_k.size()) == c.n_heads &&
                  int64_t(b.w_v.size()) == c.n_heads,
              "[ref::TransformerLM] a block has {}/{}/{} q/k/v head matrices, expected n_heads {}", b.w_q.size(),
              b.w_k.size(), b.w_v.size(), c.n_heads);
  Gradients expected(c);  // the reference shapes, built from the config alone
  auto want = expected.parameters();
  auto have = parameters();
  for (size_t i = 0; i < have.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : want[i].shape) n *= d;
    TOY_CHECK(have[i].shape == want[i].shape && int64_t(have[i].data->size()) == n,
              "[ref::TransformerLM] parameter {} has {} values (dims {}), expected {} values", have[i].name,
              have[i].data->size(), have[i].shape.size() == 2 ? shape_str(have[i].shape[0], have[i].shape[1])
                                                               : "[" + std::to_string(have[i].shape[0]) + "]",
              n);
  }
}

// token_ids [T] -> x [T, d_model], x[i] = token_embed[id_i] + pos_embed[i].
Mat TransformerLM::embed(const std::vector<int32_t>& ids) const {
  const int64_t t = int64_t(ids.size()), d = config_.d_model;
  Mat x(t, d);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < d; ++j) x.set(i, j, token_embed.get(ids[size_t(i)], j) + pos_embed.get(i, j));
  return x;
}

// h_in [T, d_model] -> proj [T, d_model]. Per head h: q, k, v = h_in · W_{q,k,v}[h]
// [T, d_head]; attn = softmax(causal(q kᵀ / sqrt(d_head))) [T, T]; out_h = attn · v.
// The heads side by side form concat [T, d_model]; proj = concat · w_o.
Mat TransformerLM::self_attention(const Mat& h_in, const Block& block, LayerCache& cache) const {
  const int64_t t = h_in.nrows, dh = config_.d_head();
  const double inv_sqrt = 1.0 / std::sqrt(double(dh));
  cache.heads.assign(size_t(config_.n_heads), HeadCache{});
  cache.concat = Mat(t, config_.d_model);
  for (int64_t h = 0; h < config_.n_heads; ++h) {
    HeadCache& hc = cache.heads[size_t(h)];
    hc.q = h_in.matmul(block.w_q[size_t(h)]);
    hc.k = h_in.matmul(block.w_k[size_t(h)]);
    hc.v = h_in.matmul(block.w_v[size_t(h)]);
    hc.attn = hc.q.matmul_t(hc.k);
    hc.attn.scale_(inv_sqrt);
    apply_causal_mask_(hc.attn, 0);
    softmax_rows_(hc.attn);
    hc.head_out = hc.attn.matmul(hc.v);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < dh; ++j) cache.concat.set(i, h * dh + j, hc.head_out.get(i, j));
  }
  return cache.concat.matmul(block.w_o);
}

// h [T, d_model] -> [T, d_model] = gelu_tanh(h · w_ff1) · w_ff2, via pre/hidden [T, d_ff].
Mat TransformerLM::feed_forward(const Mat& h, const Block& block, LayerCache& cache) const {
  cache.ff_pre = h.matmul(block.w_ff1);
  cache.ff_hidden = Mat(cache.ff_pre.nrows, cache.ff_pre.ncols);
  for (size_t i = 0; i < cache.ff_pre.flat.size(); ++i) cache.ff_hidden.flat[i] = gelu_tanh(cache.ff_pre.flat[i]);
  return cache.ff_hidden.matmul(block.w_ff2);
}

// x [T, d_model] -> cache.x_out [T, d_model]; pre-norm residual block.
void TransformerLM::transformer_block(const Mat& x, const Block& block, LayerCache& cache) const {
  NormResult n1 = rms_norm(x, block.norm1_gamma);
  cache.h_norm1 = std::move(n1.y);
  cache.rms1 = std::move(n1.rms);
  cache.x_attn = x.plus(self_attention(cache.h_norm1, block, cache));

  NormResult n2 = rms_norm(cache.x_attn, block.norm2_gamma);
  cache.h_norm2 = std::move(n2.y);
  cache.rms2 = std::move(n2.rms);
  cache.x_out = cache.x_attn.plus(feed_forward(cache.h_norm2, block, cache));
}

// token_ids [T] -> logits [T, vocab_size].
Mat TransformerLM::forward(const std::vector<int32_t>& token_ids) {
  check_tokens(token_ids, "forward");
  check_param_shapes();
  has_cache_ = false;  // a throw below must not leave a half-written cache usable
  ForwardCache& c = cache_;
  c.token_ids = token_ids;
  c.x_embed = embed(token_ids);
  c.layers.assign(size_t(config_.n_layers), LayerCache{});
  const Mat* x = &c.x_embed;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    transformer_block(*x, blocks[size_t(l)], c.layers[size_t(l)]);
    x = &c.layers[size_t(l)].x_out;
  }
  c.x_block_out = *x;
  NormResult nf = rms_norm(c.x_block_out, norm_final_gamma);
  c.x_final = std::move(nf.y);
  c.rms_final = std::move(nf.rms);
  c.logits = c.x_final.matmul_t(token_embed);  // tied unembedding: x_final · token_embedᵀ
  has_cache_ = true;
  return c.logits;
}

double TransformerLM::loss(const std::vector<int32_t>& token_ids) {
  return cross_entropy_grad(forward(token_ids), token_ids).loss;
}

// d_out [T, d_model] -> d_h [T, d_model]; grads.w_ff1 [d_model, d_ff], grads.w_ff2 [d_ff, d_model] +=.
Mat TransformerLM::feed_forward_backward(const Mat& d_out, const LayerCache& cache, const Block& block,
                                         Block& grads) const {
  grads.w_ff2.add_(cache.ff_hidden.t_matmul(d_out));  // out = hidden · w_ff2
  Mat d_pre = d_out.matmul_t(block.w_ff2);            // d_hidden, turned into d_pre in place
  for (size_t i = 0; i < d_pre.flat.size(); ++i) d_pre.flat[i] *= gelu_tanh_grad(cache.ff_pre.flat[i]);
  grads.w_ff1.add_(cache.h_norm2.t_matmul(d_pre));  // pre = h · w_ff1
  return d_pre.matmul_t(block.w_ff1);
}

// d_proj [T, d_model] -> d_h_in [T, d_model]; grads.w_o and every head's w_q/w_k/w_v +=.
Mat TransformerLM::self_attention_backward(const Mat& d_proj, const LayerCache& cache, const Block& block,
                                           Block& grads) const {
  const int64_t t = d_proj.nrows, dh = config_.d_head();
  const double inv_sqrt = 1.0 / std::sqrt(double(dh));
  const Mat& h_in = cache.h_norm1;

  grads.w_o.add_(cache.concat.t_matmul(d_proj));  // proj = concat · w_o
  Mat d_concat = d_proj.matmul_t(block.w_o);

  Mat d_h_in(t, config_.d_model);
  for (int64_t h = 0; h < config_.n_heads; ++h) {
    const HeadCache& hc = cache.heads[size_t(h)];
    Mat d_out(t, dh);  // this head's columns of d_concat
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < dh; ++j) d_out.set(i, j, d_concat.get(i, h * dh + j));

    // out = attn · v
    Mat d_attn = d_out.matmul_t(hc.v);
    Mat d_v = hc.attn.t_matmul(d_out);
    // attn = softmax(scores); masked entries have attn = 0, so they pass no gradient.
    Mat d_scores = softmax_rows_backward(hc.attn, d_attn);
    d_scores.scale_(inv_sqrt);
    // scores = q · kᵀ
    Mat d_q = d_scores.matmul(hc.k);
    Mat d_k = d_scores.t_matmul(hc.q);

    grads.w_q[size_t(h)].add_(h_in.t_matmul(d_q));
    grads.w_k[size_t(h)].add_(h_in.t_matmul(d_k));
    grads.w_v[size_t(h)].add_(h_in.t_matmul(d_v));
    d_h_in.add_(d_q.matmul_t(block.w_q[size_t(h)]));
    d_h_in.add_(d_k.matmul_t(block.w_k[size_t(h)]));
    d_h_in.add_(d_v.matmul_t(block.w_v[size_t(h)]));
  }
  return d_h_in;
}

// dx_out [T, d_model], x_in [T, d_model] -> dx_in [T, d_model]. Each residual passes its
// gradient straight through and adds the branch's.
Mat TransformerLM::transformer_block_backward(const Mat& dx_out, const Mat& x_in, const Block& block,
                                              const LayerCache& cache, Block& grads) const {
  // x_out = x_attn + ffn(rms_norm(x_attn))
  Mat d_h2 = feed_forward_backward(dx_out, cache, block, grads);
  Mat d_x_attn = dx_out.plus(rms_norm_backward(cache.x_attn, block.norm2_gamma, cache.rms2, d_h2, grads.norm2_gamma));
  // x_attn = x_in + attention(rms_norm(x_in))
  Mat d_h1 = self_attention_backward(d_x_attn, cache, block, grads);
  return d_x_attn.plus(rms_norm_backward(x_in, block.norm1_gamma, cache.rms1, d_h1, grads.norm1_gamma));
}

// dx [T, d_model] -> token_embed rows of the ids and pos_embed rows 0..T-1 +=; repeats add up.
void TransformerLM::embed_backward(const std::vector<int32_t>& ids, const Mat& dx, Gradients& grads) const {
  const int64_t d = config_.d_model;
  for (int64_t i = 0; i < dx.nrows; ++i)
    for (int64_t j = 0; j < d; ++j) {
      grads.token_embed.flat[size_t(ids[size_t(i)] * d + j)] += dx.get(i, j);
      grads.pos_embed.flat[size_t(i * d + j)] += dx.get(i, j);
    }
}

double TransformerLM::backward(const std::vector<int32_t>& token_ids, Gradients& grads) {
  TOY_CHECK(has_cache_ && cache_.token_ids == token_ids,
            "[ref::TransformerLM::backward] expected forward() on the same {} token ids first, found {}",
            token_ids.size(), has_cache_ ? "a forward of other ids" : "no forward");
  {
    Gradients expected(config_);
    auto want = expected.parameters();
    auto have = grads.parameters();
    TOY_CHECK(have.size() == want.size(), "[ref::TransformerLM::backward] gradients have {} tensors, expected {}",
              have.size(), want.size());
    for (size_t i = 0; i < have.size(); ++i)
      TOY_CHECK(have[i].shape == want[i].shape && have[i].data->size() == want[i].data->size(),
                "[ref::TransformerLM::backward] gradient {} does not match the model's config", have[i].name);
  }
  const ForwardCache& c = cache_;
  if (token_ids.size() < 2) {
    grads.loss = 0.0;
    return 0.0;
  }
  LossResult lr = cross_entropy_grad(c.logits, token_ids);
  grads.loss = lr.loss;

  // Tied unembedding, logits = x_final · token_embedᵀ:
  //   d token_embed += dlogitsᵀ · x_final [V, d];   d x_final = dlogits · token_embed [T, d].
  grads.token_embed.add_(lr.dlogits.t_matmul(c.x_final));
  Mat dx = lr.dlogits.matmul(token_embed);
  dx = rms_norm_backward(c.x_block_out, norm_final_gamma, c.rms_final, dx, grads.norm_final_gamma);

  for (int64_t l = config_.n_layers - 1; l >= 0; --l) {
    const Mat& x_in = l == 0 ? c.x_embed : c.layers[size_t(l - 1)].x_out;
    dx = transformer_block_backward(dx, x_in, blocks[size_t(l)], c.layers[size_t(l)], grads.blocks[size_t(l)]);
  }
  embed_backward(token_ids, dx, grads);
  return lr.loss;
}

// ============================================================================ optimizers ====

void TransformerLM::sgd_step(const Gradients& grads, double lr) {
  auto ps = parameters();
  auto gs = const_cast<Gradients&>(grads).parameters();  // only read below
  TOY_CHECK(ps.size() == gs.size(), "[ref::TransformerLM::sgd_step] gradients have {} tensors, expected {}",
            gs.size(), ps.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    std::vector<double>& p = *ps[k].data;
    const std::vector<double>& g = *gs[k].data;
    TOY_CHECK(p.size() == g.size(), "[ref::TransformerLM::sgd_step] gradient {} has {} values, expected {}",
              gs[k].name, g.size(), p.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
  }
}

void TransformerLM::adam_step(const Gradients& grads, AdamState& state, double lr, double beta1, double beta2,
                              double eps) {
  auto ps = parameters();
  auto gs = const_cast<Gradients&>(grads).parameters();  // only read below
  auto ms = state.m.parameters();
  auto vs = state.v.parameters();
  TOY_CHECK(ps.size() == gs.size() && ps.size() == ms.size() && ps.size() == vs.size(),
            "[ref::TransformerLM::adam_step] gradients/m/v have {}/{}/{} tensors, expected {}", gs.size(),
            ms.size(), vs.size(), ps.size());
  for (size_t k = 0; k < ps.size(); ++k)
    TOY_CHECK(gs[k].data->size() == ps[k].data->size() && ms[k].data->size() == ps[k].data->size() &&
                  vs[k].data->size() == ps[k].data->size(),
              "[ref::TransformerLM::adam_step] {}: gradient/m/v sizes {}/{}/{}, expected {}", ps[k].name,
              gs[k].data->size(), ms[k].data->size(), vs[k].data->size(), ps[k].data->size());

  // Bias-correction products kept as running products (one multiply per step).
  state.bc1 *= beta1;
  state.bc2 *= beta2;
  state.step += 1;
  const double omc1 = 1.0 - state.bc1, omc2 = 1.0 - state.bc2;
  for (size_t k = 0; k < ps.size(); ++k) {
    std::vector<double>& p = *ps[k].data;
    const std::vector<double>& g = *gs[k].data;
    std::vector<double>& m = *ms[k].data;
    std::vector<double>& v = *vs[k].data;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / omc1, v_hat = v[i] / omc2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
}

// ============================================================================ generation ====

std::vector<int32_t> TransformerLM::generate_from_ids(const std::vector<int32_t>& start_ids, int64_t max_tokens,
                                                      double temperature, const std::function<double()>& uniform) {
  TOY_CHECK(!start_ids.empty(), "[ref::TransformerLM::generate_from_ids] expected at least 1 start id, got 0");
  TOY_CHECK(max_tokens >= 0, "[ref::TransformerLM::generate_from_ids] max_tokens must be >= 0, got {}",
            max_tokens);
  TOY_CHECK(temperature <= 0.0 || uniform,
            "[ref::TransformerLM::generate_from_ids] temperature {} > 0 needs a uniform random number source",
            temperature);
  std::vector<int32_t> tokens = start_ids;
  for (int64_t step = 0; step < max_tokens; ++step) {
    // The trailing window of at most context_length tokens (learned positions end there).
    const size_t n = std::min(tokens.size(), size_t(config_.context_length));
    std::vector<int32_t> ctx(tokens.end() - std::ptrdiff_t(n), tokens.end());
    Mat logits = forward(ctx);
    const double u = temperature > 0.0 ? uniform() : 0.0;
    tokens.push_back(sample_logits_row(logits, int64_t(n) - 1, temperature, u));
  }
  return tokens;
}

}  // namespace toy::ref
