// The sampler's chain as a kernel (kern::SampleToken): the same steps, in the same order and
// precision, as llama.cpp's chain the Sampler documents; scratch is the thread's and reused,
// so a warm decoder allocates nothing per token.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"

namespace toy::cpu {

namespace {
// Keeps the first `keep` candidates and renormalises their probabilities (also when all are
// kept: top-p always renormalises, min-p only after a cut — the bits of the sampler before).
void cut_to(std::vector<double>& p, std::vector<int32_t>& idx, size_t keep) {
  p.resize(keep);
  idx.resize(keep);
  double s = 0;
  for (double v : p) s += v;
  for (double& v : p) v /= s;
}

int32_t sample_chain(std::vector<float>& z, const int32_t* penalized, int64_t n_penalized, const SampleDraw& a) {
  thread_local std::vector<int32_t> idx;
  thread_local std::vector<double> p;
  const int32_t V = int32_t(z.size());
  // Penalties (as llama.cpp applies them, first).
  for (int64_t i = 0; i < n_penalized; ++i) {
    const int32_t id = penalized[2 * i], count = penalized[2 * i + 1];
    if (count == 0) continue;  // padding
    float& l = z[size_t(id)];
    l = l > 0 ? l / a.repeat_penalty : l * a.repeat_penalty;
    l -= float(count) * a.frequency_penalty + a.presence_penalty;
  }
  if (a.temperature == 0.0f) return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
  // Candidates: every id, or when top-k / top-p / min-p cut them, sorted by logit
  // (descending, ties by id) and cut by top-k.
  idx.reserve(size_t(V));
  p.reserve(size_t(V));
  idx.resize(size_t(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int32_t k = a.top_k > 0 ? std::min(a.top_k, V) : V;
  if (k < V || a.top_p < 1.0f || a.min_p > 0) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t x, int32_t y) {
      return z[size_t(x)] > z[size_t(y)] || (z[size_t(x)] == z[size_t(y)] && x < y);
    });
    idx.resize(size_t(k));
  }
  // Softmax over the candidates at the temperature (in double).
  const double mx = *std::max_element(z.begin(), z.end());
  p.resize(idx.size());
  double total = 0;
  for (size_t i = 0; i < idx.size(); ++i) total += p[i] = std::exp((z[size_t(idx[i])] - mx) / a.temperature);
  for (double& v : p) v /= total;
  // Min-p: drop the tail below min_p times the most likely token's probability (p is sorted).
  if (a.min_p > 0) {
    size_t keep = 1;
    while (keep < p.size() && p[keep] >= a.min_p * p[0]) ++keep;
    if (keep < p.size()) cut_to(p, idx, keep);
  }
  // Top-p: the smallest prefix whose mass reaches top_p.
  if (a.top_p < 1.0f) {
    double cum = 0;
    size_t keep = p.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= a.top_p) {
        keep = i + 1;
        break;
      }
    }
    cut_to(p, idx, keep);
  }
  double cum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (a.r < cum) return idx[i];
  }
  return idx.back();
}

// Greedy over f32 logits with no penalties (what most serving runs): the first NaN's
// index, or else the first maximum's — std::max_element's answer — from two vector passes
// over the row instead of a copy and two scalar ones. Returns the chain's encoding (a NaN at
// i is -1 - i).
int32_t greedy_f32(const float* z, int64_t V) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_loadu_ps(z + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) break;  // a NaN in this 8: found below
    mx = _mm256_max_ps(mx, v);
  }
  float best = -INFINITY;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float l : lanes) best = std::max(best, l);
  for (int64_t j = i; j < V; ++j) {
    if (std::isnan(z[j])) return -1 - int32_t(j);
    best = std::max(best, z[j]);
  }
  const __m256 b = _mm256_set1_ps(best);
  int64_t k = 0;
  for (; k + 8 <= V; k += 8) {
    const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(z + k), b, _CMP_EQ_OQ));
    if (m) return int32_t(k + std::countr_zero(unsigned(m)));
  }
  for (; k < V; ++k)
    if (z[k] == best) return int32_t(k);
  return 0;  // (unreachable: best is one of the values)
}

}  // namespace

void sample_token(const Tensor& logits, const Tensor& penalized, Tensor& out, const SampleDraw& a) {
  if (a.temperature == 0.0f && !penalized.defined() && logits.dtype() == DType::F32) {
    out.data<int32_t>()[0] = greedy_f32(logits.data<float>(), logits.numel());
    return;
  }
  thread_local std::vector<float> z;
  dispatch_float(logits.dtype(), "sample", [&]<class T>(std::type_identity<T>) {
    const T* src = logits.data<T>();  // contiguous (the op makes it so)
    z.resize(size_t(logits.numel()));
    for (size_t i = 0; i < z.size(); ++i) z[i] = to_f32(src[i]);
  });
  int32_t* o = out.data<int32_t>();
  for (size_t i = 0; i < z.size(); ++i)
    if (std::isnan(z[i])) {
      o[0] = -1 - int32_t(i);
      return;
    }
  o[0] = sample_chain(z, penalized.defined() ? penalized.data<int32_t>() : nullptr,
                      penalized.defined() ? penalized.shape()[0] : 0, a);
}

}  // namespace toy::cpu
