// The CPU backend's kernels, one declaration per kernel of backend/kernels.h (same names,
// same signatures). Defined in the AVX2 translation units of this folder and registered by
// install.cpp, which is compiled without AVX so the start-up CPU check runs first.
#pragma once
#include "toy/backend/kernels.h"

namespace toy::cpu {

kern::Unary unary;
kern::UnaryBackward unary_backward;
kern::Binary binary;
kern::Copy copy;
kern::Fill fill;
kern::Swiglu swiglu;
kern::SwigluBackward swiglu_backward;
kern::SwigluPacked swiglu_packed;
kern::SwigluPackedBackward swiglu_packed_backward;
kern::Dropout dropout;
kern::Matmul matmul;
kern::MatmulBias matmul_bias;
kern::MatmulRowSums matmul_row_sums;
kern::MatmulWeight matmul_weight;
kern::MatmulWeightT matmul_weight_t;
kern::MatmulTakesHalf matmul_takes_half;
kern::MatmulRounded matmul_rounded;
kern::Reduce reduce;
kern::Argsort argsort;
kern::TopK top_k;
kern::RmsNorm rms_norm;
kern::RmsNormBackward rms_norm_backward;
kern::LayerNorm layer_norm;
kern::LayerNormBackward layer_norm_backward;
kern::L2Norm l2_norm;
kern::L2NormBackward l2_norm_backward;
kern::Softmax softmax;
kern::SoftmaxBackward softmax_backward;
kern::DiagMask diag_mask;
kern::Rope rope;
kern::Attention attention;
kern::AttentionBackward attention_backward;
kern::AttentionDecode attention_decode;
kern::GetRows get_rows;
kern::ScatterAddRows scatter_add_rows;
kern::SetRows set_rows;
kern::CrossEntropy cross_entropy;
kern::CrossEntropyBackward cross_entropy_backward;
kern::CrossEntropyTotal cross_entropy_total;
kern::Im2Col im2col;
kern::Col2Im col2im;
kern::SsmConv ssm_conv;
kern::SsmConvBackward ssm_conv_backward;
kern::SsmScan ssm_scan;
kern::SsmScanBackward ssm_scan_backward;
kern::GatedDeltaRule gated_delta_rule;
kern::GatedDeltaRuleBackward gated_delta_rule_backward;
kern::GdnSplitNorm gdn_split_norm;
kern::GdnSplitNormBackward gdn_split_norm_backward;
kern::MulMatId mul_mat_id;
kern::MulMatId mul_mat_id_weight;
kern::MulMatIdBackward mul_mat_id_backward;
kern::AddId add_id;
kern::Sgd sgd;
kern::AdamW adamw;
kern::AdamWRanges adamw_ranges;
kern::SquareNormsRanges square_norms_ranges;
kern::OptimizerClock optimizer_clock;
kern::StepClock step_clock;
kern::SampleToken sample_token;
kern::RandomFill random_fill;
kern::Arange arange;

// Peak single-precision FMA throughput of this machine (GFLOP/s) on `threads` threads,
// measured by a register-only FMA loop (for benchmark ratios).
double measure_fma_peak_gflops(int threads, double seconds);

}  // namespace toy::cpu
