// The launchers of the unary, swiglu, dropout, random-fill and arange kernels (unary.cu), in
// plain types (no toy or CUDA headers); glue_unary.cpp turns tensors into these views. The
// semantics are the CPU kernels' (backend/cpu/elementwise.cpp, random.cpp), the per-element
// math is in unary_math.h. Float views are F32, F16 or BF16 (computed in f32); inputs may be
// strided, outputs are contiguous. Every launcher queues its kernel on the compute stream and
// returns at once; nothing is read back to the host.
#pragma once
#include <cstdint>

#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

// y = op(x), op in kern::UnaryOp's order; alpha is Scale's factor, lo and hi Clamp's bounds.
// y may be x itself (same contiguous layout: the in-place scale_).
void launch_unary(int op, float alpha, float lo, float hi, const View& x, const View& y);
// dx = g op'(x) (op'(x) from y where the CPU uses it).
void launch_unary_backward(int op, float alpha, float lo, float hi, const View& x, const View& y, const View& g,
                           const View& dx);

// out = silu(a) * b; da = g b silu'(a), db = g silu(a).
void launch_swiglu(const View& a, const View& b, const View& out);
void launch_swiglu_backward(const View& a, const View& b, const View& g, const View& da, const View& db);
// Packed rows: x [rows, 2F] -> out [rows, F] = silu(x[:, :F]) * x[:, F:]; dx [rows, 2F] from
// x and g [rows, F]. F = out's (g's) last dimension.
void launch_swiglu_packed(const View& x, const View& out, int64_t F);
void launch_swiglu_packed_backward(const View& x, const View& g, const View& dx, int64_t F);

// Philox4x32-10's key and first counter.
struct PhiloxArgs {
  uint64_t seed = 0, stream = 0, counter = 0;
};
// y = x * keep / (1 - p), element i kept when word i % 4 of block counter + i / 4 is at least
// p 2^32; with `step` (a device I32 scalar, or null) the counters start at step * 2^32 more.
void launch_dropout(const View& x, const View& y, float p, const PhiloxArgs& rng, const int32_t* step);
// dst (contiguous, float) element i from block counter + i / per: normal (per 2, Box-Muller,
// mean a, std b) or uniform in [a, b) (per 4).
void launch_random_fill(const View& dst, const PhiloxArgs& rng, bool normal, float a, float b);
// dst[i] = i (F32, F16, BF16 or I32; contiguous).
void launch_arange(const View& dst);

}  // namespace toy::cuda
