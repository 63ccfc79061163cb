// `woq quantize` as one library call: the choices by name, as the CLI's flags
// and the Python API's keyword arguments spell them, checked in one place, and
// the run (GPTQ calibration when asked, then quantize_checkpoint, or
// export_gguf for a .gguf output) with the lines the CLI prints.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/thread_pool.h"

namespace woq {

/// The choices of `woq quantize`. Unset optionals are "not given": they take
/// the CLI's defaults, and only given ones are refused where they do not
/// apply (a GPTQ option with method rtn, a GPTQ-directory option with a GGUF
/// output). Error messages name the CLI's flags (--damp-percent).
struct QuantizeRequest {
  std::string input;   ///< Hugging Face directory (float; for GGUF output also GPTQ) or .gguf file
  std::string output;  ///< directory (GPTQ) or .gguf file
  std::string format;  ///< gptq, awq (AutoAWQ GEMM) or gguf; empty: gguf when `output` ends in .gguf
  /// A model card's recipe, whose choices fill the options not given: w8a16 =
  /// gptq, sym_int8, per channel, damp_percent 0.01, no desc_act, random
  /// calibration tokens (Neural Magic's Llama-2-7b w8a16 card); w4a16 = gptq,
  /// sym_int4, group_size 128, desc_act. With method rtn given, only low_bit
  /// and group_size come from it.
  std::optional<std::string> recipe;
  std::optional<std::string> low_bit;  ///< default sym_int4
  /// A plan file (model/quant_plan.h) instead of low_bit: each linear layer's
  /// format (GGUF output only, in the formats GGUF has).
  std::optional<std::string> plan;
  std::optional<std::string> method;   ///< rtn (default), gptq, awq or awq+gptq
  bool force = false;                  ///< replace an existing output
  /// GPTQ: continue the interrupted run on this output from its last finished
  /// block (quantize/resume.h); it must have had the same input, options and
  /// calibration. Without it, an interrupted run's blocks are discarded.
  bool resume = false;
  std::optional<std::int64_t> group_size;  ///< default 128; 32 for a GGUF input of ggml blocks; -1 = per channel
  std::optional<std::string> int4_range;   ///< full (default) or clip
  std::optional<std::string> rounding;     ///< gguf output: woq (default) or ggml
  std::optional<std::string> gptq_format;  ///< v1 (default) or v2
  std::optional<double> max_shard_gb;      ///< default 5 (GB of 1e9 bytes)
  // GPTQ only.
  std::optional<double> damp_percent;      ///< default 0.01, in (0, 1]
  std::optional<bool> desc_act, static_groups, true_sequential;  ///< default false
  std::optional<std::int64_t> block_size;  ///< default 128
  std::optional<std::string> calib;        ///< "random" (default: nsamples x seqlen) or "random:NxL"
  std::optional<std::string> calib_file;   ///< a text file cut into nsamples windows of seqlen tokens
  std::optional<std::int64_t> nsamples;    ///< default 32
  std::optional<std::int64_t> seqlen;      ///< default 512, or the model's context when shorter
  std::optional<std::uint64_t> seed;       ///< of the random calibration tokens; default 0
  // AWQ only (calibration as GPTQ's).
  std::optional<int> awq_grid;             ///< scale exponents searched; default 20
  std::optional<bool> awq_clip;            ///< the clipping search; default true
  std::optional<std::int64_t> awq_search_tokens;  ///< rows each scale search's loss takes; default 512, 0: all
  /// What the next block's calibration inputs are: "float" (default: this block's float outputs, AutoAWQ's
  /// order) or "quantized" (its outputs as quantized, as GPTQ's).
  std::optional<std::string> awq_propagate;
};

/// Callbacks of a quantize run: `log` receives each line the CLI prints
/// (notes, the calibration line, "layer i/n quantized in ...", the summary
/// "wrote OUT ...", peak RSS), without the "woq: " prefix; `layers(done,
/// total)` after each decoder block. Either may be null.
struct QuantizeCallbacks {
  std::function<void(const std::string&)> log;
  Progress layers;
  /// Asked after each decoder block; true stops the run there with a
  /// woq::Error (a GPTQ or AWQ run's finished blocks stay for resume). May be null.
  std::function<bool()> stop;
};

/// `request` as it runs: its recipe's choices filled in, and a trailing '/'
/// of the output path dropped. Throws woq::Error for an unknown recipe or
/// one with --format gguf.
QuantizeRequest with_recipe(const QuantizeRequest& request);

/// Throws woq::Error for a bad choice that needs no file to see: an unknown
/// name (recipe, format, low_bit, int4_range, rounding, method, gptq_format), an
/// option that does not apply (see QuantizeRequest), a damp_percent outside
/// (0, 1], a non-positive size, or a calib that is not random / random:NxL.
void validate(const QuantizeRequest& request);

/// Runs the request on `pool`. Throws woq::Error for what validate() refuses,
/// a calibration longer than the model's context or larger than memory,
/// an existing output without force (before any calibration), and what
/// quantize_checkpoint / export_gguf throw.
void run_quantize_request(const QuantizeRequest& request, ThreadPool& pool, const QuantizeCallbacks& callbacks);

}  // namespace woq
