// Registers the CPU kernels. Compiled without AVX flags: it only takes the kernels'
// addresses, after the start-up check has confirmed the CPU can run them.
#include <cblas.h>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/core/cpu_features.h"
#include "toy/core/registry.h"

namespace toy {

void install_cpu_backend(Registry& r) {
  require_cpu_features();
  // OpenBLAS runs single-threaded inside our thread pool's partitioning.
  openblas_set_num_threads(1);
  const Device d = Device::CPU;
  r.add<kern::Unary>("unary", d, &cpu::unary);
  r.add<kern::UnaryBackward>("unary_backward", d, &cpu::unary_backward);
  r.add<kern::Binary>("binary", d, &cpu::binary);
  r.add<kern::Copy>("copy", d, &cpu::copy);
  r.add<kern::Fill>("fill", d, &cpu::fill);
  r.add<kern::Swiglu>("swiglu", d, &cpu::swiglu);
  r.add<kern::SwigluBackward>("swiglu_backward", d, &cpu::swiglu_backward);
  r.add<kern::SwigluPacked>("swiglu_packed", d, &cpu::swiglu_packed);
  r.add<kern::SwigluPackedBackward>("swiglu_packed_backward", d, &cpu::swiglu_packed_backward);
  r.add<kern::Dropout>("dropout", d, &cpu::dropout);
  r.add<kern::Matmul>("matmul", d, &cpu::matmul);
  r.add<kern::MatmulWeight>("matmul_weight", d, &cpu::matmul_weight);
  r.add<kern::MatmulWeightT>("matmul_weight_t", d, &cpu::matmul_weight_t);
  r.add<kern::Reduce>("reduce", d, &cpu::reduce);
  r.add<kern::Argsort>("argsort", d, &cpu::argsort);
  r.add<kern::TopK>("top_k", d, &cpu::top_k);
  r.add<kern::RmsNorm>("rms_norm", d, &cpu::rms_norm);
  r.add<kern::RmsNormBackward>("rms_norm_backward", d, &cpu::rms_norm_backward);
  r.add<kern::LayerNorm>("layer_norm", d, &cpu::layer_norm);
  r.add<kern::LayerNormBackward>("layer_norm_backward", d, &cpu::layer_norm_backward);
  r.add<kern::L2Norm>("l2_norm", d, &cpu::l2_norm);
  r.add<kern::L2NormBackward>("l2_norm_backward", d, &cpu::l2_norm_backward);
  r.add<kern::Softmax>("softmax", d, &cpu::softmax);
  r.add<kern::SoftmaxBackward>("softmax_backward", d, &cpu::softmax_backward);
  r.add<kern::DiagMask>("diag_mask_inf", d, &cpu::diag_mask);
  r.add<kern::Rope>("rope", d, &cpu::rope);
  r.add<kern::Attention>("attention", d, &cpu::attention);
  r.add<kern::AttentionBackward>("attention_backward", d, &cpu::attention_backward);
  r.add<kern::GetRows>("get_rows", d, &cpu::get_rows);
  r.add<kern::ScatterAddRows>("get_rows_backward", d, &cpu::scatter_add_rows);
  r.add<kern::SetRows>("set_rows", d, &cpu::set_rows);
  r.add<kern::CrossEntropy>("cross_entropy", d, &cpu::cross_entropy);
  r.add<kern::CrossEntropyBackward>("cross_entropy_backward", d, &cpu::cross_entropy_backward);
  r.add<kern::Im2Col>("im2col", d, &cpu::im2col);
  r.add<kern::Col2Im>("col2im", d, &cpu::col2im);
  r.add<kern::SsmConv>("ssm_conv", d, &cpu::ssm_conv);
  r.add<kern::SsmConvBackward>("ssm_conv_backward", d, &cpu::ssm_conv_backward);
  r.add<kern::SsmScan>("ssm_scan", d, &cpu::ssm_scan);
  r.add<kern::SsmScanBackward>("ssm_scan_backward", d, &cpu::ssm_scan_backward);
  r.add<kern::GatedDeltaRule>("gated_delta_rule", d, &cpu::gated_delta_rule);
  r.add<kern::GatedDeltaRuleBackward>("gated_delta_rule_backward", d, &cpu::gated_delta_rule_backward);
  r.add<kern::GdnSplitNorm>("gdn_split_norm", d, &cpu::gdn_split_norm);
  r.add<kern::GdnSplitNormBackward>("gdn_split_norm_backward", d, &cpu::gdn_split_norm_backward);
  r.add<kern::MulMatId>("mul_mat_id", d, &cpu::mul_mat_id);
  r.add<kern::MulMatIdBackward>("mul_mat_id_backward", d, &cpu::mul_mat_id_backward);
  r.add<kern::AddId>("add_id", d, &cpu::add_id);
  r.add<kern::Sgd>("sgd", d, &cpu::sgd);
  r.add<kern::AdamW>("adamw", d, &cpu::adamw);
}

}  // namespace toy
