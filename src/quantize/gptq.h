// GPTQ (Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training
// Quantization for Generative Pre-trained Transformers", ICLR 2023,
// arXiv 2210.17323), following AutoGPTQ's fasterquant: quantize the columns
// of W one at a time, each time spreading the rounding error over the columns
// not yet quantized through the inverse Hessian of the layer's inputs, with
// lazy batch updates in blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "formats/low_bit.h"
#include "model/quant_plan.h"

namespace woq {

/// Settings of one GPTQ run (names as in AutoGPTQ's BaseQuantizeConfig).
struct GptqOptions {
  QuantSpec spec;              ///< sym_int4 (full or clip), asym_int4 or sym_int8, group_size or -1
  double damp_percent = 0.01;  ///< lambda = damp_percent * mean(diag H) added to diag H
  bool desc_act = false;       ///< process columns by decreasing diag(H) ("act order")
  bool static_groups = false;  ///< fit every group's scale/zero on the original W up front
  std::int64_t block_size = 128;  ///< columns per lazy batch update
  /// gptq_block_quantizer only: each block linear takes the plan's format
  /// instead of `spec` (one that stays float is converted, not fitted).
  std::shared_ptr<const QuantPlan> plan = nullptr;
};

/// The Hessian of a linear layer's reconstruction error, H = (2 / T) X^T X,
/// accumulated over T calibration input rows x (fp32 accumulation like AutoGPTQ).
class Hessian {
 public:
  /// For inputs of K features. Throws woq::Error if K < 1.
  explicit Hessian(std::int64_t k);
  /// Adds rows x[0, rows) of K features each (row-major), over pool's
  /// threads when given (parallel_ssyrk_upper; the same sums either way).
  void add(const float* x, std::int64_t rows, ThreadPool* pool = nullptr);
  std::int64_t k() const { return k_; }
  std::int64_t rows() const { return rows_; }
  /// The full symmetric [K, K] matrix in f64, row-major. Throws woq::Error if no rows were added.
  std::vector<double> matrix() const;

 private:
  std::int64_t k_;
  std::int64_t rows_ = 0;
  std::vector<float> sum_;  ///< upper triangle of X^T X, row-major [K, K]
};

/// What GPTQ derives from a Hessian: shared by the linear layers that read
/// the same input (q/k/v, gate/up), so it is computed once for them.
struct GptqHessian {
  std::int64_t k = 0;
  std::vector<bool> dead;          ///< [K] inputs with H_ii = 0
  std::vector<std::int32_t> perm;  ///< [K] processing order (identity without desc_act)
  std::vector<double> u;           ///< [K, K] upper Cholesky factor of (H + lambda I)^-1, in processing order
};

/// Dead inputs, the desc_act order, damping and the inverse Cholesky factor
/// (LAPACK dpotrf + dtrtri) of `h` ([K, K] f64), the LAPACK calls on
/// `threads` OpenBLAS threads (woq's thread count; 0: OpenBLAS's own) for
/// K >= 4096 and on one below (OpenBLAS's waiting threads cost more than
/// they save there). Throws
/// woq::Error if H + lambda*I is not positive definite (raise damp_percent)
/// or on bad sizes.
GptqHessian prepare_gptq(std::vector<double> h, std::int64_t k, const GptqOptions& options, int threads = 0);

/// GPTQ of W [N, K] with a prepared Hessian (options must be those it was prepared with).
QuantMatrix gptq_quantize(const float* w, std::int64_t n, std::int64_t k, const GptqHessian& prepared,
                          const GptqOptions& options, ThreadPool& pool);

/// GPTQ of W [N, K] (fp32 row-major) given its Hessian `h` ([K, K] f64 as
/// from Hessian::matrix). Returns W in options.spec's format; with desc_act
/// (and without static_groups) the result has input_order set (groups are
/// formed in processing order, as GPTQ's g_idx records). Inputs with
/// H_ii = 0 ("dead") get weight 0. Group parameters follow woq's RTN rule of
/// the format (group_rule.h), fitted on the error-updated weights when a group
/// starts (the block size is rounded to a multiple of group_size so that a
/// group never straddles a lazy update). Throws woq::Error if H + lambda*I
/// is not positive definite (raise damp_percent) or on a bad spec.
QuantMatrix gptq_quantize(const float* w, std::int64_t n, std::int64_t k, std::vector<double> h,
                          const GptqOptions& options, ThreadPool& pool);

}  // namespace woq
