// The glue of the recurrent and MoE kernels (scan.cu, moe.cu): ssm_scan, gated_delta_rule and
// mul_mat_id, with their backwards. Each function passes the kernel gate, checks what the
// launchers rely on (f32 contiguous tensors as the ops hand them, the head sizes the kernels
// take; W's types for mul_mat_id), reads the geometry and queues the launch. Scratch comes from
// toy's allocator on the device.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/cuda/scan_launch.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

// The address of a contiguous tensor of type d (null when undefined or empty).
void* address(const Tensor& t, DType d, const char* kernel, const char* what) {
  if (!t.defined()) return nullptr;
  TOY_CHECK(t.dtype() == d, "[cuda] {}: {} must be {}, got {}", kernel, what, name(d), name(t.dtype()));
  TOY_CHECK(t.is_contiguous(), "[cuda] {}: {} must be contiguous", kernel, what);
  return t.numel() == 0 ? nullptr : data_of(t);
}
const float* in_f32(const Tensor& t, const char* kernel, const char* what) {
  return static_cast<const float*>(address(t, DType::F32, kernel, what));
}
float* out_f32(const Tensor& t, const char* kernel, const char* what) {
  return static_cast<float*>(address(t, DType::F32, kernel, what));
}

// Scratch of n elements of type d on the GPU (at least one, so it has an address).
Tensor scratch(int64_t n, DType d) { return empty(Shape{std::max<int64_t>(n, 1)}, d, Device::CUDA); }

// ---- ssm scan ------------------------------------------------------------------------------------

SsmScanGeometry ssm_geometry(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                             const Tensor& s0, const char* k) {
  SsmScanGeometry g;
  g.B = x.size(0), g.T = x.size(1), g.H = x.size(2), g.P = x.size(3), g.G = Bm.size(2), g.N = Bm.size(3);
  TOY_CHECK(g.N <= kSsmScanMaxN, "[cuda] {} with a state of {} columns (the GPU kernel takes up to {})", k, g.N,
            kSsmScanMaxN);
  g.x = in_f32(x, k, "x"), g.dt = in_f32(dt, k, "dt"), g.A = in_f32(A, k, "A");
  g.Bm = in_f32(Bm, k, "B"), g.C = in_f32(C, k, "C"), g.s0 = in_f32(s0, k, "s0");
  return g;
}

void ssm_scan(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& C, const Tensor& s0,
              Tensor& y, Tensor& s_final) {
  pass_kernel_gate(x, dt, A, Bm, C, s0, y, s_final);
  const char* k = "ssm_scan";
  const SsmScanGeometry g = ssm_geometry(x, dt, A, Bm, C, s0, k);
  launch_ssm_scan(g, out_f32(y, k, "y"), out_f32(s_final, k, "s_final"));
  launched(k);
}

void ssm_scan_backward(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                       const Tensor& s0, const Tensor& gy, const Tensor& gs, Tensor& dx, Tensor& ddt, Tensor& dA,
                       Tensor& dB, Tensor& dC, Tensor& ds0) {
  pass_kernel_gate(x, dt, A, Bm, C, s0, gy, gs, dx, ddt, dA, dB, dC, ds0);
  const char* k = "ssm_scan_backward";
  const SsmScanGeometry g = ssm_geometry(x, dt, A, Bm, C, s0, k);
  const Tensor work = scratch(ssm_scan_backward_scratch(g), DType::F32);
  launch_ssm_scan_backward(g, in_f32(gy, k, "gy"), in_f32(gs, k, "gs"), out_f32(dx, k, "dx"), out_f32(ddt, k, "ddt"),
                           out_f32(dA, k, "dA"), out_f32(dB, k, "dB"), out_f32(dC, k, "dC"), out_f32(ds0, k, "ds0"),
                           out_f32(work, k, "scratch"));
  launched(k);
}

// ---- gated delta rule ----------------------------------------------------------------------------

GatedDeltaGeometry gdn_geometry(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                const Tensor& s0, const char* kn) {
  GatedDeltaGeometry r;
  r.B = q.size(0), r.T = q.size(1), r.Hk = q.size(2), r.Dk = q.size(3), r.Hv = v.size(2), r.Dv = v.size(3);
  TOY_CHECK(r.Dk <= kGatedDeltaMaxHead && r.Dv <= kGatedDeltaMaxHead,
            "[cuda] {} with heads of {} and {} elements (the GPU kernels take up to {})", kn, r.Dk, r.Dv,
            kGatedDeltaMaxHead);
  r.q = in_f32(q, kn, "q"), r.k = in_f32(k, kn, "k"), r.v = in_f32(v, kn, "v");
  r.g = in_f32(g, kn, "g"), r.beta = in_f32(beta, kn, "beta"), r.s0 = in_f32(s0, kn, "s0");
  return r;
}
Shape starts_shape(const GatedDeltaGeometry& g) {
  return Shape{g.B, g.Hv, (g.T + kGatedDeltaEvery - 1) / kGatedDeltaEvery, g.Dk, g.Dv};
}

// (chunk only chooses the CPU's algorithm: the GPU's token-by-token form is exact for any.)
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const Tensor& s0, int64_t chunk, Tensor& o, Tensor& s_final, Tensor& starts) {
  pass_kernel_gate(q, k, v, g, beta, s0, chunk, o, s_final, starts);
  const char* kn = "gated_delta_rule";
  const GatedDeltaGeometry geo = gdn_geometry(q, k, v, g, beta, s0, kn);
  if (starts.defined())
    TOY_CHECK(starts.shape() == starts_shape(geo), "[cuda] {}: starts must be {}, got {}", kn,
              starts_shape(geo).str(), starts.shape().str());
  launch_gated_delta_rule(geo, out_f32(o, kn, "o"), out_f32(s_final, kn, "s_final"), out_f32(starts, kn, "starts"));
  launched(kn);
}

void gated_delta_rule_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                               const Tensor& s0, const Tensor& starts, const Tensor& go, const Tensor& gs, Tensor& dq,
                               Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& ds0) {
  pass_kernel_gate(q, k, v, g, beta, s0, starts, go, gs, dq, dk, dv, dg, dbeta, ds0);
  const char* kn = "gated_delta_rule_backward";
  const GatedDeltaGeometry geo = gdn_geometry(q, k, v, g, beta, s0, kn);
  // The state before every 64th token: the forward's, or recomputed here.
  Tensor own;
  const float* st = nullptr;
  if (starts.defined()) {
    TOY_CHECK(starts.shape() == starts_shape(geo), "[cuda] {}: starts must be {}, got {}", kn,
              starts_shape(geo).str(), starts.shape().str());
    st = in_f32(starts, kn, "starts");
  } else {
    own = empty(starts_shape(geo), DType::F32, Device::CUDA);
    launch_gated_delta_rule(geo, nullptr, nullptr, out_f32(own, kn, "starts"));
    launched(kn);
    st = in_f32(own, kn, "starts");
  }
  const Tensor work = scratch(gated_delta_rule_backward_scratch(geo), DType::F32);
  launch_gated_delta_rule_backward(geo, st, in_f32(go, kn, "go"), in_f32(gs, kn, "gs"), out_f32(dq, kn, "dq"),
                                   out_f32(dk, kn, "dk"), out_f32(dv, kn, "dv"), out_f32(dg, kn, "dg"),
                                   out_f32(dbeta, kn, "dbeta"), out_f32(ds0, kn, "ds0"), out_f32(work, kn, "scratch"));
  launched(kn);
}

// ---- MoE -----------------------------------------------------------------------------------------

std::string upper(std::string_view v) {
  std::string s(v);
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

MulMatIdGeometry moe_geometry(const Tensor& w, const Tensor& x, const Tensor& ids, const char* k) {
  TOY_CHECK(!is_block(w.dtype()), "[cuda] {} of a {} expert tensor: the GPU's quantized kernels are not written yet",
            k, upper(name(w.dtype())));
  MulMatIdGeometry g;
  switch (w.dtype()) {
    case DType::F32: g.w_elem = Elem::F32; break;
    case DType::F16: g.w_elem = Elem::F16; break;
    case DType::BF16: g.w_elem = Elem::BF16; break;
    default: fail("[cuda] {}: experts must be f32, f16 or bf16, got {}", k, name(w.dtype()));
  }
  g.E = w.size(0), g.N = w.size(1), g.K = w.size(2), g.T = ids.size(0), g.U = ids.size(1), g.X = x.size(1);
  g.w = address(w, w.dtype(), k, "experts");
  g.x = in_f32(x, k, "x");
  g.ids = static_cast<const int32_t*>(address(ids, DType::I32, k, "ids"));
  return g;
}

void mul_mat_id(const Tensor& w, const Tensor& x, const Tensor& ids, Tensor& out) {
  pass_kernel_gate(w, x, ids, out);
  const char* k = "mul_mat_id";
  const MulMatIdGeometry g = moe_geometry(w, x, ids, k);
  launch_mul_mat_id(g, out_f32(out, k, "out"));
  launched(k);
}

void mul_mat_id_backward(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& grad, Tensor& dx,
                         Tensor& dw) {
  pass_kernel_gate(w, x, ids, grad, dx, dw);
  const char* k = "mul_mat_id_backward";
  const MulMatIdGeometry g = moe_geometry(w, x, ids, k);
  const Tensor work = scratch(mul_mat_id_backward_scratch(g), DType::I32);
  launch_mul_mat_id_backward(g, in_f32(grad, k, "g"), out_f32(dx, k, "dx"), out_f32(dw, k, "dw"),
                             static_cast<int32_t*>(address(work, DType::I32, k, "scratch")));
  launched(k);
}

}  // namespace

void register_scan(Registry& r) {
  r.add<kern::SsmScan>("ssm_scan", Device::CUDA, &ssm_scan);
  r.add<kern::SsmScanBackward>("ssm_scan_backward", Device::CUDA, &ssm_scan_backward);
  r.add<kern::GatedDeltaRule>("gated_delta_rule", Device::CUDA, &gated_delta_rule);
  r.add<kern::GatedDeltaRuleBackward>("gated_delta_rule_backward", Device::CUDA, &gated_delta_rule_backward);
  r.add<kern::MulMatId>("mul_mat_id", Device::CUDA, &mul_mat_id);
  r.add<kern::MulMatIdBackward>("mul_mat_id_backward", Device::CUDA, &mul_mat_id_backward);
}

}  // namespace toy::cuda
