// Registers the CPU kernels, each also as the sim device's (backend/sim/sim_kernel.h). Compiled without AVX flags: it only takes the kernels'
// addresses, after the start-up check has confirmed the CPU can run them.
#include <cblas.h>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/sim/sim_kernel.h"
#include "toy/core/cpu_features.h"
#include "toy/core/registry.h"

namespace toy {

void install_cpu_backend(Registry& r) {
  require_cpu_features();
  kernel_variant();  // a bad TOY_CPU is refused here, before any kernel runs
  // OpenBLAS runs single-threaded inside our thread pool's partitioning.
  openblas_set_num_threads(1);
  sim::add_cpu_and_sim<kern::Unary, &cpu::unary>(r, "unary");
  sim::add_cpu_and_sim<kern::UnaryBackward, &cpu::unary_backward>(r, "unary_backward");
  sim::add_cpu_and_sim<kern::Binary, &cpu::binary>(r, "binary");
  sim::add_cpu_and_sim<kern::Copy, &cpu::copy>(r, "copy");
  sim::add_cpu_and_sim<kern::Fill, &cpu::fill>(r, "fill");
  sim::add_cpu_and_sim<kern::RandomFill, &cpu::random_fill>(r, "random_fill");
  sim::add_cpu_and_sim<kern::Arange, &cpu::arange>(r, "arange");
  sim::add_cpu_and_sim<kern::Swiglu, &cpu::swiglu>(r, "swiglu");
  sim::add_cpu_and_sim<kern::SwigluBackward, &cpu::swiglu_backward>(r, "swiglu_backward");
  sim::add_cpu_and_sim<kern::SwigluPacked, &cpu::swiglu_packed>(r, "swiglu_packed");
  sim::add_cpu_and_sim<kern::SwigluPackedBackward, &cpu::swiglu_packed_backward>(r, "swiglu_packed_backward");
  sim::add_cpu_and_sim<kern::Dropout, &cpu::dropout>(r, "dropout");
  sim::add_cpu_and_sim<kern::Matmul, &cpu::matmul>(r, "matmul");
  sim::add_cpu_and_sim<kern::MatmulBias, &cpu::matmul_bias>(r, "matmul_bias");
  sim::add_cpu_and_sim<kern::MatmulRowSums, &cpu::matmul_row_sums>(r, "matmul_row_sums");
  sim::add_cpu_and_sim<kern::MatmulWeight, &cpu::matmul_weight>(r, "matmul_weight");
  sim::add_cpu_and_sim<kern::MatmulWeightT, &cpu::matmul_weight_t>(r, "matmul_weight_t");
  sim::add_cpu_and_sim<kern::MatmulTakesHalf, &cpu::matmul_takes_half>(r, "matmul_takes_half");
  sim::add_cpu_and_sim<kern::MatmulRounded, &cpu::matmul_rounded>(r, "matmul_rounded");
  sim::add_cpu_and_sim<kern::Reduce, &cpu::reduce>(r, "reduce");
  sim::add_cpu_and_sim<kern::Argsort, &cpu::argsort>(r, "argsort");
  sim::add_cpu_and_sim<kern::TopK, &cpu::top_k>(r, "top_k");
  sim::add_cpu_and_sim<kern::RmsNorm, &cpu::rms_norm>(r, "rms_norm");
  sim::add_cpu_and_sim<kern::RmsNormBackward, &cpu::rms_norm_backward>(r, "rms_norm_backward");
  sim::add_cpu_and_sim<kern::LayerNorm, &cpu::layer_norm>(r, "layer_norm");
  sim::add_cpu_and_sim<kern::LayerNormBackward, &cpu::layer_norm_backward>(r, "layer_norm_backward");
  sim::add_cpu_and_sim<kern::L2Norm, &cpu::l2_norm>(r, "l2_norm");
  sim::add_cpu_and_sim<kern::L2NormBackward, &cpu::l2_norm_backward>(r, "l2_norm_backward");
  sim::add_cpu_and_sim<kern::Softmax, &cpu::softmax>(r, "softmax");
  sim::add_cpu_and_sim<kern::SoftmaxBackward, &cpu::softmax_backward>(r, "softmax_backward");
  sim::add_cpu_and_sim<kern::DiagMask, &cpu::diag_mask>(r, "diag_mask_inf");
  sim::add_cpu_and_sim<kern::Rope, &cpu::rope>(r, "rope");
  sim::add_cpu_and_sim<kern::Attention, &cpu::attention>(r, "attention");
  sim::add_cpu_and_sim<kern::AttentionBackward, &cpu::attention_backward>(r, "attention_backward");
  sim::add_cpu_and_sim<kern::AttentionDecode, &cpu::attention_decode>(r, "attention_decode");
  sim::add_cpu_and_sim<kern::GetRows, &cpu::get_rows>(r, "get_rows");
  sim::add_cpu_and_sim<kern::ScatterAddRows, &cpu::scatter_add_rows>(r, "get_rows_backward");
  sim::add_cpu_and_sim<kern::SetRows, &cpu::set_rows>(r, "set_rows");
  sim::add_cpu_and_sim<kern::CrossEntropy, &cpu::cross_entropy>(r, "cross_entropy");
  sim::add_cpu_and_sim<kern::CrossEntropyBackward, &cpu::cross_entropy_backward>(r, "cross_entropy_backward");
  sim::add_cpu_and_sim<kern::CrossEntropyTotal, &cpu::cross_entropy_total>(r, "cross_entropy_total");
  sim::add_cpu_and_sim<kern::Im2Col, &cpu::im2col>(r, "im2col");
  sim::add_cpu_and_sim<kern::Col2Im, &cpu::col2im>(r, "col2im");
  sim::add_cpu_and_sim<kern::SsmConv, &cpu::ssm_conv>(r, "ssm_conv");
  sim::add_cpu_and_sim<kern::SsmConvBackward, &cpu::ssm_conv_backward>(r, "ssm_conv_backward");
  sim::add_cpu_and_sim<kern::SsmScan, &cpu::ssm_scan>(r, "ssm_scan");
  sim::add_cpu_and_sim<kern::SsmScanBackward, &cpu::ssm_scan_backward>(r, "ssm_scan_backward");
  sim::add_cpu_and_sim<kern::GatedDeltaRule, &cpu::gated_delta_rule>(r, "gated_delta_rule");
  sim::add_cpu_and_sim<kern::GatedDeltaRuleBackward, &cpu::gated_delta_rule_backward>(r, "gated_delta_rule_backward");
  sim::add_cpu_and_sim<kern::GdnSplitNorm, &cpu::gdn_split_norm>(r, "gdn_split_norm");
  sim::add_cpu_and_sim<kern::GdnSplitNormBackward, &cpu::gdn_split_norm_backward>(r, "gdn_split_norm_backward");
  sim::add_cpu_and_sim<kern::MulMatId, &cpu::mul_mat_id>(r, "mul_mat_id");
  sim::add_cpu_and_sim<kern::MulMatId, &cpu::mul_mat_id_weight>(r, "mul_mat_id_weight");
  sim::add_cpu_and_sim<kern::MulMatIdBackward, &cpu::mul_mat_id_backward>(r, "mul_mat_id_backward");
  sim::add_cpu_and_sim<kern::AddId, &cpu::add_id>(r, "add_id");
  sim::add_cpu_and_sim<kern::Sgd, &cpu::sgd>(r, "sgd");
  sim::add_cpu_and_sim<kern::AdamW, &cpu::adamw>(r, "adamw");
  sim::add_cpu_and_sim<kern::AdamWRanges, &cpu::adamw_ranges>(r, "adamw_ranges");
  sim::add_cpu_and_sim<kern::SquareNormsRanges, &cpu::square_norms_ranges>(r, "square_norms_ranges");
  sim::add_cpu_and_sim<kern::OptimizerClock, &cpu::optimizer_clock>(r, "optimizer_clock");
  sim::add_cpu_and_sim<kern::StepClock, &cpu::step_clock>(r, "step_clock");
  sim::add_cpu_and_sim<kern::SampleToken, &cpu::sample_token>(r, "sample_token");
}

}  // namespace toy
