// Matmuls on the GPU through cuBLASLt: matmul (batched, transposed views without copies),
// matmul_weight and matmul_weight_t (y = x W^T and dx = g W). The semantics are the CPU's
// (backend/cpu/matmul*.cpp): products accumulate in f32 — F32 runs pinned to
// CUBLAS_COMPUTE_32F (TOY_TF32=1 allows TF32 tensor cores), F16/BF16 operands run on the
// tensor cores with an f32 accumulator — and an F16/BF16 weight meets activations rounded to
// its type, as the CPU and llama.cpp round them. Block-type (GGUF) weights wait for the
// quantized kernels and are refused by name.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include <fmt/core.h>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("[cuda] cuBLASLt {}: status {} ({})", what, int(s), cublasGetStatusString(s));
}

cudaDataType lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("[cuda] matmul of {} tensors (the GPU multiplies f32, f16 and bf16)", name(t));
  }
}

bool tf32_allowed() {
  static const bool on = [] {
    const char* v = std::getenv("TOY_TF32");
    return v && std::string(v) == "1";
  }();
  return on;
}

// One handle and one workspace for the process (one stream, one GPU per process).
struct Lt {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  size_t workspace_bytes = 0;
};

Lt& lt() {
  static Lt* l = [] {
    auto* r = new Lt();
    check_lt(cublasLtCreate(&r->handle), "create");
    r->workspace_bytes = size_t(32) << 20;  // (what NVIDIA suggests for Hopper)
    r->workspace = empty(Shape{int64_t(r->workspace_bytes / 4)}, DType::F32, Device::CUDA);
    return r;
  }();
  return *l;
}

// A 2-D operand in row-major terms: element (r, c) at p + r * rs + c * cs, batches batch_stride
// apart (0: broadcast).
struct Mat {
  const void* p = nullptr;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0, rs = 0, cs = 0, batch_stride = 0;
};

// cuBLASLt is column-major: a row-major R x C matrix with unit column stride is a column-major
// C x R one (ld = rs), with unit row stride a transposed column-major R x C (ld = cs).
struct LtOperand {
  bool trans = false;
  int64_t rows = 0, cols = 0, ld = 0;
};
bool lt_operand(const Mat& m, LtOperand* o) {
  if (m.cs == 1 || m.cols == 1) {
    *o = {false, m.cols, m.rows, m.rows == 1 ? std::max<int64_t>(m.cols, 1) : m.rs};
    if (o->ld >= std::max<int64_t>(m.cols, 1)) return true;
  }
  if (m.rs == 1 || m.rows == 1) {
    *o = {true, m.rows, m.cols, m.cols == 1 ? std::max<int64_t>(m.rows, 1) : m.cs};
    if (o->ld >= std::max<int64_t>(m.rows, 1)) return true;
  }
  return false;
}

// The largest power of two (up to 256) dividing every address a batched operand touches.
uint32_t alignment(const void* p, int64_t batch_stride, DType t, int64_t batches) {
  uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(p));
  if (batches > 1) a |= uint64_t(batch_stride) * element_size(t);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

struct AlgoKey {
  int64_t v[20];
  bool operator==(const AlgoKey& o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};
struct AlgoKeyHash {
  size_t operator()(const AlgoKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ size_t(x)) * 1099511628211ull;
    return h;
  }
};

struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Everything a matmul of one key needs but its pointers: the descriptors and the heuristic's
// first algorithm, made once per shape. Creating them costs tens of microseconds per call,
// more than a decode step's small GEMM takes on the GPU.
struct LtPlan {
  LtDescs d;
  cublasLtMatmulAlgo_t algo{};
};
std::mutex g_plan_mu;
std::unordered_map<AlgoKey, std::unique_ptr<LtPlan>, AlgoKeyHash> g_plans;
// (prompts of every length each make a plan: past this many the cache starts again)
constexpr size_t kMaxPlans = 4096;

cublasLtMatrixLayout_t layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int64_t batches,
                              int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld), "layout");
  if (batches > 1) {
    const int32_t count = int32_t(batches);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                              sizeof batch_stride),
             "batch stride");
  }
  return l;
}

// c = alpha * a @ b + beta * c for `batches` strided batches: a [M, K], b [K, N], c [M, N]
// (c's column stride 1). a and b of one type (F32, F16 or BF16), c F32 or of a's type; each of
// a and b with a unit stride on one side (lt_operand).
void lt_gemm(const Mat& a, const Mat& b, const Mat& c, int64_t batches, float alpha, float beta) {
  LtOperand oa, ob;
  TOY_CHECK(lt_operand(a, &oa) && lt_operand(b, &ob) && c.cs == 1, "[cuda] matmul: an operand without a unit stride");
  const int64_t M = c.rows, N = c.cols, K = a.cols;
  const cudaDataType ab = lt_type(a.type), ct = lt_type(c.type);
  const bool f32 = a.type == DType::F32;
  const cublasComputeType_t compute = f32 && tf32_allowed() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Row-major c = a b is column-major c^T = b^T a^T: cuBLASLt's A is b, its B is a.
  const cublasOperation_t opA = ob.trans ? CUBLAS_OP_T : CUBLAS_OP_N, opB = oa.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t al_a = alignment(b.p, b.batch_stride, b.type, batches);
  const uint32_t al_b = alignment(a.p, a.batch_stride, a.type, batches);
  const uint32_t al_c = alignment(c.p, c.batch_stride, c.type, batches);
  const AlgoKey key{{M, N, K, batches, int64_t(ab), int64_t(ct), int64_t(compute), int64_t(opA), int64_t(opB), ob.ld,
                     oa.ld, c.rs, b.batch_stride, a.batch_stride, c.batch_stride, al_a, al_b, al_c, beta != 0.0f, 0}};
  // (held through the launch: a full cache is cleared under it)
  std::lock_guard<std::mutex> lock(g_plan_mu);
  LtPlan* plan = nullptr;
  {
    auto it = g_plans.find(key);
    if (it != g_plans.end()) {
      plan = it->second.get();
    } else {
      if (g_plans.size() >= kMaxPlans) g_plans.clear();
      auto p = std::make_unique<LtPlan>();
      LtDescs& d = p->d;
      check_lt(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F), "descriptor");
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA), "transa");
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB), "transb");
      d.a = layout(ab, ob.rows, ob.cols, ob.ld, batches, b.batch_stride);
      d.b = layout(ab, oa.rows, oa.cols, oa.ld, batches, a.batch_stride);
      d.c = layout(ct, N, M, c.rs, batches, c.batch_stride);
      check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "preference");
      const uint64_t ws = lt().workspace_bytes;
      check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "workspace");
      // (the heuristic otherwise assumes 256-byte aligned pointers: views and batches may not be)
      check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                    sizeof al_a), "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                    sizeof al_b), "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                    sizeof al_c), "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                    sizeof al_c), "alignment");
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      check_lt(cublasLtMatmulAlgoGetHeuristic(lt().handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found),
               "heuristic");
      TOY_CHECK(found > 0, "[cuda] cuBLASLt has no algorithm for a {}x{}x{} matmul of {} (batches {})", M, N, K,
                name(a.type), batches);
      p->algo = result.algo;
      plan = g_plans.emplace(key, std::move(p)).first->second.get();
    }
  }
  const LtDescs& d = plan->d;
  check_lt(cublasLtMatmul(lt().handle, d.op, &alpha, b.p, d.a, a.p, d.b, &beta, c.p, d.c, const_cast<void*>(c.p), d.c,
                          &plan->algo, data_of(lt().workspace), lt().workspace_bytes,
                          static_cast<cudaStream_t>(compute_stream())),
           "matmul");
  profile_mark(a.type == DType::BF16 ? "cublasLt bf16"
               : a.type == DType::F16 ? "cublasLt f16"
               : compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "cublasLt tf32" : "cublasLt f32");
}

Mat last_two(const Tensor& t, int64_t batch_stride) {
  const int n = t.ndim();
  return {data_of(t), t.dtype(), t.size(n - 2), t.size(n - 1), t.stride(n - 2), t.stride(n - 1), batch_stride};
}

// The tensor itself when cuBLASLt reads it as it is (type `want`, a unit stride on one side of
// its last two dims), else a contiguous copy of type `want`.
Tensor gemm_ready(const Tensor& x, DType want) {
  LtOperand o;
  if (x.dtype() == want && lt_operand(last_two(x, 0), &o)) return x;
  Tensor c = empty(x.shape(), want, Device::CUDA);
  launch_copy(view_of(x), view_of(c));
  launched("copy");
  return c;
}

// The one stride that walks all of t's batch dims (those before the last two) in c's row-major
// batch order, when there is one.
bool batch_stride_of(const Tensor& t, const Tensor& c, int64_t* stride) {
  const int nb = c.ndim() - 2;
  int64_t s = -1, expect_next = -1;
  for (int d = nb - 1; d >= 0; --d) {
    if (c.size(d) == 1) continue;
    if (s < 0) {
      s = t.stride(d);
      expect_next = s * c.size(d);
    } else {
      if (t.stride(d) != expect_next) return false;
      expect_next = t.stride(d) * c.size(d);
    }
  }
  *stride = s < 0 ? 0 : s;
  return true;
}

void scale_in_place(Tensor& c, float beta) {
  if (beta == 0.0f) {
    launch_fill(view_of(c), 0.0);
    launched("fill");
    return;
  }
  Tensor s = full(Shape{1}, double(beta), c.dtype(), Device::CUDA);
  const Tensor every = make_view(s, c.shape(), Strides(std::vector<int64_t>(size_t(c.ndim()), 0)), 0);  // (broadcast by zero strides)
  launch_binary(int(kern::BinaryOp::Mul), view_of(c), view_of(every), view_of(c));
  launched("binary");
}

void matmul(const Tensor& a_in, const Tensor& b_in, Tensor& c_out, float alpha, float beta) {
  pass_kernel_gate(a_in, b_in, c_out);
  const int nd = c_out.ndim();
  const int64_t M = c_out.size(nd - 2), N = c_out.size(nd - 1), K = a_in.size(nd - 1);
  if (c_out.numel() == 0) return;
  if (K == 0) return scale_in_place(c_out, beta);
  // One type for a and b; c F32 or that type. Mixed inputs are widened to f32 (as the CPU does).
  const bool same = a_in.dtype() == b_in.dtype() && (c_out.dtype() == a_in.dtype() || c_out.dtype() == DType::F32);
  const DType ab = same ? a_in.dtype() : DType::F32;
  Tensor a = gemm_ready(a_in, ab), b = gemm_ready(b_in, ab);
  Tensor c = c_out;
  if (c_out.dtype() != ab && c_out.dtype() != DType::F32) {
    c = empty(c_out.shape(), DType::F32, Device::CUDA);
    if (beta != 0.0f) launch_copy(view_of(c_out), view_of(c)), launched("copy");
  }
  const int64_t batches = c.numel() / (M * N);
  int64_t sa = 0, sb = 0;
  if (batches == 1 || (batch_stride_of(a, c, &sa) && batch_stride_of(b, c, &sb))) {
    lt_gemm(last_two(a, sa), last_two(b, sb), last_two(c, M * N), batches, alpha, beta);
  } else {  // batch dims no single stride walks: one call per batch
    for (int64_t bi = 0; bi < batches; ++bi) {
      int64_t oa = 0, ob = 0, rest = bi;
      for (int d = nd - 3; d >= 0; --d) {
        const int64_t i = rest % c.size(d);
        rest /= c.size(d);
        oa += i * a.stride(d), ob += i * b.stride(d);
      }
      Mat ma = last_two(a, 0), mb = last_two(b, 0), mc = last_two(c, 0);
      ma.p = static_cast<const char*>(ma.p) + oa * element_size(a.dtype());
      mb.p = static_cast<const char*>(mb.p) + ob * element_size(b.dtype());
      mc.p = static_cast<const char*>(mc.p) + bi * M * N * element_size(c.dtype());
      lt_gemm(ma, mb, mc, 1, alpha, beta);
    }
  }
  if (!c.is_same(c_out)) launch_copy(view_of(c), view_of(c_out)), launched("copy");
}

void refuse_blocks(const Tensor& w, const char* kernel) {
  TOY_CHECK(!is_block(w.dtype()), "[cuda] {} with a {} weight: the GPU's quantized kernels are not written yet "
            "(dequantize the model to f16/bf16, or run it on the CPU)", kernel, name(w.dtype()));
}

// y [N, out] (+)= x [N, in] W^T.
void matmul_weight(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  pass_kernel_gate(x, w, y);
  refuse_blocks(w, "matmul_weight");
  const int64_t N = x.size(0), in = w.size(1), out = w.size(0);
  if (y.numel() == 0) return;
  if (in == 0) return scale_in_place(y, accumulate ? 1.0f : 0.0f);
  // x is rounded to an F16/BF16 weight's type (the CPU's rounding), then both go to the
  // tensor cores with an f32 accumulator.
  Tensor xr = gemm_ready(x, w.dtype());
  const Mat a{data_of(xr), xr.dtype(), N, in, xr.stride(0), xr.stride(1), 0};
  const Mat b{data_of(w), w.dtype(), in, out, 1, in, 0};  // W^T as a view
  const Mat c{data_of(y), y.dtype(), N, out, out, 1, 0};
  lt_gemm(a, b, c, 1, 1.0f, accumulate ? 1.0f : 0.0f);
}

// dx [N, in] = g [N, out] W (W widened to f32, as the CPU widens it).
void matmul_weight_t(const Tensor& g, const Tensor& w, Tensor& dx) {
  pass_kernel_gate(g, w, dx);
  refuse_blocks(w, "matmul_weight_t");
  const int64_t N = g.size(0), in = w.size(1), out = w.size(0);
  if (dx.numel() == 0) return;
  if (out == 0) return scale_in_place(dx, 0.0f);
  Tensor wf = gemm_ready(w, DType::F32), gf = gemm_ready(g, DType::F32);
  const Mat a{data_of(gf), DType::F32, N, out, gf.stride(0), gf.stride(1), 0};
  const Mat b{data_of(wf), DType::F32, out, in, in, 1, 0};
  const Mat c{data_of(dx), dx.dtype(), N, in, in, 1, 0};
  lt_gemm(a, b, c, 1, 1.0f, 0.0f);
}

}  // namespace

void register_matmul(Registry& r) {
  r.add<kern::Matmul>("matmul", Device::CUDA, &matmul);
  r.add<kern::MatmulWeight>("matmul_weight", Device::CUDA, &matmul_weight);
  r.add<kern::MatmulWeightT>("matmul_weight_t", Device::CUDA, &matmul_weight_t);
  r.add<kern::MatmulTakesHalf>("matmul_takes_half", Device::CUDA,
                               +[](DType t) { return t == DType::F16 || t == DType::BF16; });
}

}  // namespace toy::cuda
