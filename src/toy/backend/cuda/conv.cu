// im2col / col2im for conv2d, and the depthwise causal conv over time (ssm_conv) with its
// backward, as the CPU's conv.cpp computes them. Every output element has one writer and
// adds its terms in a fixed order (no atomics), so results do not depend on timing:
//  - im2col, ssm_conv and both dx: one thread per output element (grid-stride loops over the
//    row-major order; inputs read at offset_of, any strides);
//  - col2im gathers, per dx element, the cols entries that read it, in the CPU's order
//    (output rows ascending: kh, then kw, descending), so its f32 sums match the CPU's bits;
//  - ssm_conv's dw: a 32 x 8 block per (32 channels, tap k); the 8 thread rows stride over
//    the B*T positions (coalesced loads along c), summing in double, and their partials are
//    combined in row order through shared memory.
#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/misc_launch.h"

namespace toy::cuda {

namespace {

__device__ __forceinline__ int64_t first_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

template <class T>
__device__ __forceinline__ float at(const DeviceView& v, int64_t i) {
  return load_f<T>(v, offset_of(v, i));
}


// Calls f with a value of the C++ type of a float element type (the glue refuses others).
template <class F>
void with_float_type(Elem e, F&& f) {
  with_type(e, [&](auto t) {
    if constexpr (!std::is_same_v<decltype(t), int32_t>) f(t);
  });
}

// ---- im2col / col2im -----------------------------------------------------------------------------

// cols[(n OH + oh) OW + ow][(c KH + kh) KW + kw] = x[n, c, oh sh - ph + kh dh, ow sw - pw + kw dw].
template <class T>
__global__ void im2col_kernel(DeviceView x, ConvShape s, T* cols, int64_t total) {
  const int64_t KK = s.C * s.kh * s.kw;
  for (int64_t i = first_index(); i < total; i += grid_step()) {
    const int64_t col = i % KK, p = i / KK;
    const int64_t kw = col % s.kw, kh = (col / s.kw) % s.kh, c = col / (int64_t(s.kw) * s.kh);
    const int64_t ow = p % s.OW, oh = (p / s.OW) % s.OH, n = p / (s.OW * s.OH);
    const int64_t ih = oh * s.sh - s.ph + kh * s.dh, iw = ow * s.sw - s.pw + kw * s.dw;
    T v = elem_of<T>(0.0f);
    if (ih >= 0 && ih < s.H && iw >= 0 && iw < s.W)
      v = reinterpret_cast<const T*>(x.data)[offset_of(x, ((n * s.C + c) * s.H + ih) * s.W + iw)];
    cols[i] = v;  // (a copy: exact)
  }
}

// dx[n, c, ih, iw] = sum of the cols entries with oh sh - ph + kh dh = ih and ow sw - pw + kw dw = iw.
template <class T>
__global__ void col2im_kernel(DeviceView cols, ConvShape s, T* dx, int64_t total) {
  const int64_t KK = s.C * s.kh * s.kw;
  for (int64_t i = first_index(); i < total; i += grid_step()) {
    const int64_t iw = i % s.W, ih = (i / s.W) % s.H, c = (i / (s.W * s.H)) % s.C, n = i / (s.W * s.H * s.C);
    float acc = 0.0f;
    // The CPU adds by output position (oh, ow) ascending; oh falls as kh rises, ow as kw does.
    for (int kh = s.kh - 1; kh >= 0; --kh) {
      const int64_t th = ih + s.ph - int64_t(kh) * s.dh;
      if (th < 0 || th % s.sh != 0 || th / s.sh >= s.OH) continue;
      const int64_t oh = th / s.sh;
      for (int kw = s.kw - 1; kw >= 0; --kw) {
        const int64_t tw = iw + s.pw - int64_t(kw) * s.dw;
        if (tw < 0 || tw % s.sw != 0 || tw / s.sw >= s.OW) continue;
        const int64_t ow = tw / s.sw;
        acc += at<T>(cols, ((n * s.OH + oh) * s.OW + ow) * KK + (c * s.kh + kh) * s.kw + kw);
      }
    }
    dx[i] = elem_of<T>(acc);
  }
}

// ---- ssm_conv ------------------------------------------------------------------------------------

// y[b, t, c] = sum_k w[c, k] x[b, t + k, c], k ascending (the CPU's order).
template <class T>
__global__ void ssm_conv_kernel(DeviceView x, DeviceView w, T* y, int64_t T_, int64_t C, int64_t K, int64_t total) {
  const int64_t TX = T_ + K - 1;
  for (int64_t i = first_index(); i < total; i += grid_step()) {
    const int64_t c = i % C, bt = i / C, t = bt % T_, b = bt / T_;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) acc += at<T>(w, c * K + k) * at<T>(x, (b * TX + t + k) * C + c);
    y[i] = elem_of<T>(acc);
  }
}

// dx[b, s, c] = sum_k g[b, s - k, c] w[c, k] over 0 <= s - k < T, k ascending.
template <class T>
__global__ void ssm_conv_dx_kernel(DeviceView g, DeviceView w, T* dx, int64_t T_, int64_t C, int64_t K,
                                   int64_t total) {
  const int64_t TX = T_ + K - 1;
  for (int64_t i = first_index(); i < total; i += grid_step()) {
    const int64_t c = i % C, bs = i / C, s = bs % TX, b = bs / TX;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = s - k;
      if (t < 0 || t >= T_) continue;
      acc += at<T>(w, c * K + k) * at<T>(g, (b * T_ + t) * C + c);
    }
    dx[i] = elem_of<T>(acc);
  }
}

constexpr int kDwTile = 32;  // channels per block (x threads)
constexpr int kDwRows = 8;   // thread rows striding over the B*T positions

// dw[c, k] += sum over (b, t) of g[b, t, c] x[b, t + k, c]; block q handles tap q % K of the
// channel tile q / K.
template <class T>
__global__ void ssm_conv_dw_kernel(DeviceView x, DeviceView g, T* dw, int64_t B, int64_t T_, int64_t C, int64_t K) {
  __shared__ double part[kDwRows][kDwTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t TX = T_ + K - 1, tiles = (C + kDwTile - 1) / kDwTile;
  for (int64_t q = blockIdx.x; q < tiles * K; q += gridDim.x) {
    const int64_t k = q % K, c = (q / K) * kDwTile + tx;
    double acc = 0.0;
    if (c < C)
      for (int64_t bt = ty; bt < B * T_; bt += kDwRows) {
        const int64_t b = bt / T_, t = bt % T_;
        acc += double(at<T>(g, bt * C + c)) * double(at<T>(x, (b * TX + t + k) * C + c));
      }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < C) {
      double sum = part[0][tx];
      for (int r = 1; r < kDwRows; ++r) sum += part[r][tx];
      T& d = dw[c * K + k];
      d = elem_of<T>(to_float(d) + float(sum));  // (+=, as the CPU: f32 add, then rounded)
    }
    __syncthreads();  // (the next tile overwrites the partials)
  }
}

}  // namespace

void launch_im2col(const View& x, const ConvShape& s, const View& cols) {
  if (cols.numel == 0) return;
  with_float_type(x.elem, [&](auto tag) {
    using T = decltype(tag);
    im2col_kernel<T><<<blocks_for(cols.numel), kThreads, 0, stream()>>>(device_view(x), s,
                                                                        static_cast<T*>(cols.data), cols.numel);
  });
}

void launch_col2im(const View& cols, const ConvShape& s, const View& dx) {
  if (dx.numel == 0) return;
  with_float_type(dx.elem, [&](auto tag) {
    using T = decltype(tag);
    col2im_kernel<T><<<blocks_for(dx.numel), kThreads, 0, stream()>>>(device_view(cols), s,
                                                                      static_cast<T*>(dx.data), dx.numel);
  });
}

void launch_ssm_conv(const View& x, const View& w, const View& y) {
  if (y.numel == 0) return;
  const int64_t T_ = y.shape[1], C = y.shape[2], K = w.shape[1];
  with_float_type(x.elem, [&](auto tag) {
    using T = decltype(tag);
    ssm_conv_kernel<T><<<blocks_for(y.numel), kThreads, 0, stream()>>>(device_view(x), device_view(w),
                                                                       static_cast<T*>(y.data), T_, C, K, y.numel);
  });
}

void launch_ssm_conv_backward(const View& x, const View& w, const View& g, const View& dx, const View& dw) {
  const int64_t B = g.shape[0], T_ = g.shape[1], C = g.shape[2], K = w.shape[1];
  with_float_type(x.elem, [&](auto tag) {
    using T = decltype(tag);
    if (dx.numel > 0)
      ssm_conv_dx_kernel<T><<<blocks_for(dx.numel), kThreads, 0, stream()>>>(
          device_view(g), device_view(w), static_cast<T*>(dx.data), T_, C, K, dx.numel);
    if (dw.data && dw.numel > 0) {
      // (B * T == 0 still runs: dw += 0 leaves it as it is)
      const int64_t blocks = (C + kDwTile - 1) / kDwTile * K;
      ssm_conv_dw_kernel<T><<<unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8), dim3(kDwTile, kDwRows), 0,
                              stream()>>>(device_view(x), device_view(g), static_cast<T*>(dw.data), B, T_, C, K);
    }
  });
}

}  // namespace toy::cuda
