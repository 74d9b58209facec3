// The glue of the training-side kernels (rows.cu, rope.cu, optim.cu, sample.cu): tensors
// turned into the launchers' plain arguments, the device scratch the sorts need (allocated
// through toy, so a warm loop allocates nothing new), and the refusals of what the GPU does
// not do yet, by name.
#include <algorithm>
#include <vector>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/backend/cuda/train_launch.h"
#include "toy/backend/kernels.h"
#include "toy/core/kernel_gate.h"

namespace toy::cuda {

namespace {

// ---- helpers ---------------------------------------------------------------------------------

// A fresh device tensor of at least one element (scratch).
Tensor scratch(int64_t n, DType t) { return empty(Shape{std::max<int64_t>(n, 1)}, t, Device::CUDA); }

// The device address of a contiguous block-typed tensor (its offset counts elements).
const void* block_data(const Tensor& t) {
  return static_cast<const char*>(t.storage()->data()) + row_bytes(t.dtype(), t.offset());
}

// A small input the kernel reads on the device (an lr scalar or ids made on the host): a host
// one is uploaded; nothing ever comes back.
Tensor on_device(const Tensor& t) { return t.device() == Device::CUDA ? t : transfer(t, Device::CUDA); }

void check_sort(const char* kernel, const char* error) {
  TOY_CHECK(*error == '\0', "[cuda] {}: sorting the row ids failed: {}", kernel, error);
}

// The sort of n (id, position) pairs with ids below `rows`, and the tensors that hold it.
struct RowSortScratch {
  RowSort s;
  Tensor pairs, temp;
};
RowSortScratch row_sort(int64_t n, int64_t rows) {
  RowSortScratch r;
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < rows) ++bits;
  r.s.end_bit = bits;
  r.pairs = scratch(4 * n, DType::I32);
  int32_t* p = static_cast<int32_t*>(data_of(r.pairs));
  r.s.keys_in = reinterpret_cast<uint32_t*>(p);
  r.s.keys_out = reinterpret_cast<uint32_t*>(p + n);
  r.s.pos_in = p + 2 * n;
  r.s.pos_out = p + 3 * n;
  r.s.temp_bytes = row_sort_temp_bytes(n, bits);
  if (r.s.temp_bytes) {
    r.temp = scratch(int64_t(r.s.temp_bytes / 4 + 1), DType::F32);
    r.s.temp = data_of(r.temp);
  }
  return r;
}

// ---- rows ------------------------------------------------------------------------------------

void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  pass_kernel_gate(table, ids, out);
  if (is_block(table.dtype())) {
    TOY_CHECK(table.dtype() == DType::Q8_0,
              "[cuda] get_rows of a {} table: the GPU's quantized kernels are not written yet (it reads q8_0 tables)",
              name(table.dtype()));
    TOY_CHECK(table.is_contiguous(), "[cuda] get_rows: a block-typed table must be contiguous");
    const int64_t D = table.size(1);
    launch_get_rows_q8_0(block_data(table), int64_t(row_bytes(table.dtype(), D)), view_of(on_device(ids)),
                         static_cast<float*>(data_of(out)), D);
  } else {
    launch_get_rows(view_of(table), view_of(on_device(ids)), view_of(out));
  }
  launched("get_rows");
}

void scatter_add_rows(const Tensor& g, const Tensor& ids, Tensor& dtable) {
  pass_kernel_gate(g, ids, dtable);
  TOY_CHECK(g.dtype() == dtable.dtype(), "[cuda] get_rows_backward: gradient {} for a {} table", name(g.dtype()),
            name(dtable.dtype()));
  RowSortScratch r = row_sort(ids.numel(), dtable.size(0));
  check_sort("get_rows_backward", launch_scatter_add_rows(view_of(g), view_of(on_device(ids)), view_of(dtable), r.s));
  launched("get_rows_backward");
}

void set_rows(Tensor& dst, const Tensor& ids, const Tensor& src) {
  pass_kernel_gate(dst, ids, src);
  TOY_CHECK(!is_block(dst.dtype()),
            "[cuda] set_rows into a {} table: the GPU's quantized kernels are not written yet", name(dst.dtype()));
  RowSortScratch r = row_sort(ids.numel(), dst.size(0));
  check_sort("set_rows", launch_set_rows(view_of(dst), view_of(on_device(ids)), view_of(src), r.s));
  launched("set_rows");
}

// ---- rope ------------------------------------------------------------------------------------

void rope(const Tensor& x, const Tensor& pos, const Tensor& freq_factors, const kern::RopeArgs& a, Tensor& y) {
  pass_kernel_gate(x, pos, freq_factors, y);
  TOY_CHECK(a.n_dims / 2 <= kRopeMaxPairs, "[cuda] rope rotates up to {} dims per head, got {}", 2 * kRopeMaxPairs,
            a.n_dims);
  TOY_CHECK(pos.dtype() == DType::I32 && pos.is_contiguous(), "[cuda] rope: positions must be contiguous i32");
  // (positions or factors made on the host are uploaded: the kernel reads them on the device)
  const Tensor p = on_device(pos);
  const Tensor ff = freq_factors.defined() ? on_device(freq_factors) : Tensor();
  RopeLaunch l;
  l.x = view_of(x);
  l.pos = static_cast<const int32_t*>(data_of(p));
  l.pos_per_batch = pos.ndim() == 2;
  if (ff.defined()) {
    TOY_CHECK(ff.dtype() == DType::F32 && ff.is_contiguous(), "[cuda] rope: freq_factors must be contiguous f32");
    l.freq_factors = static_cast<const float*>(data_of(ff));
  }
  l.n_dims = a.n_dims;
  l.heads_begin = a.heads_begin;
  l.heads_end = a.heads_end < 0 ? x.size(2) : a.heads_end;
  l.neox = a.neox;
  l.freq_scale = a.freq_scale;
  l.ext_factor = a.ext_factor;
  l.sign = a.inverse ? -1.0f : 1.0f;
  tmath::rope_tables(a.n_dims, a.freq_base, a.freq_scale, a.ext_factor, a.attn_factor, a.beta_fast, a.beta_slow,
              a.n_ctx_orig, l.tables);
  launch_rope(l, data_of(y));
  launched("rope");
}

// ---- optimizers ------------------------------------------------------------------------------

float* floats(const Tensor& t) { return static_cast<float*>(data_of(t)); }

void sgd(Tensor& param, const Tensor& grad, Tensor& buf, const Tensor& lr, const kern::SgdArgs& a) {
  pass_kernel_gate(param, grad, buf, lr);
  const Tensor l = on_device(lr);
  launch_sgd(floats(param), floats(grad), buf.defined() ? floats(buf) : nullptr, floats(l), param.numel(), a.momentum,
             a.weight_decay, a.nesterov);
  launched("sgd");
}

AdamWHyper hyper(const kern::AdamWArgs& a) { return AdamWHyper{a.beta1, a.beta2, a.eps, a.weight_decay}; }

void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& lr, const Tensor& step,
           const kern::AdamWArgs& a) {
  pass_kernel_gate(param, grad, m, v, lr, step);
  const Tensor l = on_device(lr), s = on_device(step);
  launch_adamw(floats(param), floats(grad), floats(m), floats(v), floats(l), floats(s), param.numel(), hyper(a));
  launched("adamw");
}

void adamw_ranges(Tensor& values, const Tensor& grads, Tensor& m, Tensor& v, const Tensor& lr, const Tensor& step,
                  const kern::AdamWArgs& a, const std::vector<kern::ArenaRange>& ranges) {
  pass_kernel_gate(values, grads, m, v, lr, step);
  if (ranges.empty()) return;
  std::vector<ArenaSpan> spans;
  spans.reserve(ranges.size());
  for (const kern::ArenaRange& r : ranges) spans.push_back(ArenaSpan{r.begin, r.end, r.decay});
  const Tensor l = on_device(lr), s = on_device(step);
  launch_adamw_ranges(floats(values), floats(grads), floats(m), floats(v), floats(l), floats(s), spans.data(),
                      int64_t(spans.size()), hyper(a));
  launched("adamw_ranges");
}

void optimizer_clock(Tensor& step, Tensor& lr, const Tensor& position, const LrSchedule& s) {
  pass_kernel_gate(step, lr, position);
  launch_optimizer_clock(floats(step), floats(lr), static_cast<const int32_t*>(data_of(position)), s.warmup, s.total,
                         s.lr, s.min_lr);
  launched("optimizer_clock");
}

void step_clock(Tensor& step) {
  pass_kernel_gate(step);
  launch_step_clock(static_cast<int32_t*>(data_of(step)));
  launched("step_clock");
}

// ---- sampling --------------------------------------------------------------------------------

void sample_token(const Tensor& logits, const Tensor& penalized, Tensor& out, const SampleDraw& d) {
  pass_kernel_gate(logits, penalized, out);
  TOY_CHECK(logits.is_contiguous(), "[cuda] sample_token: the logits must be contiguous");
  SampleLaunch a;
  a.logits = data_of(logits);
  a.elem = view_of(logits).elem;
  a.V = int32_t(logits.numel());
  if (penalized.defined()) {
    TOY_CHECK(penalized.dtype() == DType::I32 && penalized.is_contiguous() && penalized.device() == Device::CUDA,
              "[cuda] sample_token: the penalized tokens must be contiguous i32 on the GPU");
    a.penalized = static_cast<const int32_t*>(data_of(penalized));
    a.n_penalized = penalized.numel() / 2;
  }
  a.temperature = d.temperature;
  a.top_k = d.top_k;
  a.top_p = d.top_p;
  a.min_p = d.min_p;
  a.repeat_penalty = d.repeat_penalty;
  a.presence_penalty = d.presence_penalty;
  a.frequency_penalty = d.frequency_penalty;
  a.r = d.r;
  // Scratch: z, p (doubles, as pairs of floats) and, for a sorted chain, the sort's pairs.
  SampleScratch s;
  const Tensor z = scratch(a.V, DType::F32), p = scratch(2 * int64_t(a.V), DType::F32);
  s.z = floats(z);
  s.p = reinterpret_cast<double*>(data_of(p));
  Tensor keys, ids, temp;
  if (sample_sorts(a)) {
    keys = scratch(2 * int64_t(a.V), DType::F32);
    ids = scratch(2 * int64_t(a.V), DType::I32);
    s.keys_in = floats(keys);
    s.keys_out = s.keys_in + a.V;
    s.ids_in = static_cast<int32_t*>(data_of(ids));
    s.ids_out = s.ids_in + a.V;
    s.temp_bytes = sample_sort_temp_bytes(a.V);
    temp = scratch(int64_t(s.temp_bytes / 4 + 1), DType::F32);
    s.temp = data_of(temp);
  }
  const char* error = launch_sample_token(a, s, static_cast<int32_t*>(data_of(out)));
  TOY_CHECK(*error == '\0', "[cuda] sample_token: sorting the candidates failed: {}", error);
  launched("sample_token");
}

}  // namespace

void register_train(Registry& r) {
  r.add<kern::GetRows>("get_rows", Device::CUDA, &get_rows);
  r.add<kern::ScatterAddRows>("get_rows_backward", Device::CUDA, &scatter_add_rows);
  r.add<kern::SetRows>("set_rows", Device::CUDA, &set_rows);
  r.add<kern::Rope>("rope", Device::CUDA, &rope);
  r.add<kern::Sgd>("sgd", Device::CUDA, &sgd);
  r.add<kern::AdamW>("adamw", Device::CUDA, &adamw);
  r.add<kern::AdamWRanges>("adamw_ranges", Device::CUDA, &adamw_ranges);
  r.add<kern::OptimizerClock>("optimizer_clock", Device::CUDA, &optimizer_clock);
  r.add<kern::StepClock>("step_clock", Device::CUDA, &step_clock);
  r.add<kern::SampleToken>("sample_token", Device::CUDA, &sample_token);
}

}  // namespace toy::cuda
