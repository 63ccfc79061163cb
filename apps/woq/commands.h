// Subcommands of the woq CLI. Each registers its flags on the app and returns
// the function that runs it (after parsing) and gives the exit code.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "core/ranks.h"
#include "generate/model_session.h"
#include "generate/sampler.h"
#include "model/llama.h"
#include "model/load_request.h"

namespace woq::cli {

using Run = std::function<int()>;

/// The job this process belongs to (job.cc): one process, or a rank of `mpirun -np R woq ...`.
Ranks& job();
/// Joins the job the launcher's environment names (core/ranks.h launched_ranks()) before `command` ("eval
/// perplexity") runs. With more than one rank: MPI is initialised, every rank's command must be one that runs
/// across ranks, and every rank must run the same binary with the same arguments and kernels (digests compared
/// at start). Throws woq::Error otherwise, naming what differs (on rank 0; the others throw an empty-message
/// error so that one rank reports).
void join_job(int argc, char** argv, const std::string& command);
/// FNV-1a digests of a file, or of the files of a model directory woq reads (its top-level .json, .safetensors,
/// .model, .gguf, .txt and .jinja files; not hidden files or READMEs), a line "NAME HEX" each: files up to 64
/// MiB whole, larger ones by their size, first and last 16 MiB and 1 MiB per 64 MiB between. Throws woq::Error
/// when one cannot be read.
std::string path_digest(const std::string& path);
/// Collective over `ranks`: throws woq::Error (rank 0 naming `what` and the rank) unless every rank passes the
/// same digest of what it read.
void require_same_inputs(Ranks& ranks, const std::string& what, const std::string& digest);
struct ModelFlags;
/// require_same_inputs of the model (path_digest) and of the --plan file, if one is given. Collective.
void require_same_model(Ranks& ranks, const std::string& model, const ModelFlags& flags);
/// Pipeline parallel (generate, serve): in a job of R > 1 ranks, checks that every rank reads the same model
/// (and plan) and that it has at least R decoder blocks, and gives `options` this rank's contiguous share of
/// them (share()). Collective; no effect in one process. Throws woq::Error (rank 0 says why).
void pipeline_share(Ranks& ranks, const ModelConfig& config, const std::string& model_dir, const ModelFlags& flags,
                    LoadOptions& options);
/// "woq: pipeline over R ranks, peak RSS: rank 0 blocks [0, 4) 1.20 GiB, ...": each rank's blocks and peak
/// memory so far. Collective; empty in one process.
std::string pipeline_memory(Ranks& ranks, const ModelConfig& config);
/// Reports `what` as this rank's error and ends the job (every rank) with status 1; in a one-process job,
/// prints it and returns 1.
int end_job(const std::string& what);

Run add_generate(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_make_random(CLI::App& app);
Run add_quantize(CLI::App& app);
Run add_eval(CLI::App& app);
Run add_explain(CLI::App& app);
Run add_serve(CLI::App& app);
Run add_tokenize(CLI::App& app);
Run add_chat(CLI::App& app);

/// Validators with readable messages (CLI11's NonNegativeNumber prints a
/// range up to DBL_MAX).
inline const CLI::Validator kNonNegative(
    [](std::string& s) { return !s.empty() && s[0] == '-' ? std::string("must be >= 0, got " + s) : std::string(); },
    "NONNEGATIVE");
inline const CLI::Validator kPositive(
    [](std::string& s) {
      return (!s.empty() && s[0] == '-') || s.find_first_not_of("0") == std::string::npos
                 ? std::string("must be > 0, got " + s)
                 : std::string();
    },
    "POSITIVE");

/// Refuses an empty value (an empty format would be taken for the default).
inline const CLI::Validator kNotEmpty(
    [](const std::string& v) { return v.empty() ? std::string("an empty value") : std::string(); }, "NOT_EMPTY");

/// Flags shared by commands that load a model.
struct ModelFlags {
  std::int64_t group_size = 32;
  std::string int4_range = "full";
  std::string rounding;  ///< woq or ggml (Q4_0 / Q8_0 reference rounding); empty: not given (woq)
  std::string lm_head_low_bit;  ///< empty: keep lm_head as stored
  std::string activations;      ///< int8, int16, f32 or bf16; empty: each format's default
  std::string numerics;         ///< woq or ggml; empty: the checkpoint's
  std::string plan;             ///< a plan file or a llama-quantize file type; empty: none
  int threads = 0;
};

/// Sampling flags shared by generate and chat.
struct SamplingFlags {
  float temperature = 0.8f;
  std::int32_t top_k = 40;
  float top_p = 0.95f;
  std::int64_t seed = -1;  ///< -1: random
  Penalties penalties;
  /// The sampler's parameters (a random seed when none was given); throws woq::Error on bad values.
  SamplingParams params() const;
};
/// Registers --temperature, --top-k, --top-p, --seed, --repeat-penalty, --repeat-last-n, --presence-penalty and
/// --frequency-penalty, with `flags`' values as the defaults shown.
void add_sampling_flags(CLI::App* cmd, SamplingFlags& flags);

/// Registers -t/--threads (worker threads, 0 = all cores).
void add_threads_flag(CLI::App* cmd, int& threads);

/// --low-bit of a command that loads one model: `low_bit` stays empty when the flag is not given (the
/// default, sym_int4, under LoadOptions::linear_is_default: a quantized GGUF's float layers run as stored).
void add_low_bit_flag(CLI::App* cmd, std::string& low_bit);

/// -m/--model (required) and --low-bit (add_low_bit_flag) of a command that loads one model.
void add_model_and_low_bit(CLI::App* cmd, std::string& model_dir, std::string& low_bit);
/// Registers --group-size, --int4-range, --rounding, --lm-head-low-bit, --activations and -t/--threads
/// (commands add --low-bit themselves: one type or a list).
void add_model_flags(CLI::App* cmd, ModelFlags& flags);
/// LoadOptions for linear layers in `low_bit`; throws woq::Error on bad values.
LoadOptions load_options(const ModelFlags& flags, const std::string& low_bit);

/// load_options for the reference of a comparison (eval compare, explain, recovery's baseline): --activations
/// is the candidate's, so the reference's integer layers take their formats' defaults. With `self_reference`
/// (no --ref: the model is its own reference) and a float `low_bit`, its integer layers (those stored quantized,
/// and lm_head under --lm-head-low-bit, which the reference shares) take f32 activations instead: the
/// reference is those integers dequantized, so the comparison shows what the candidate's activations change.
LoadOptions reference_load_options(const ModelFlags& flags, const std::string& low_bit, bool self_reference);
/// Loads `session`'s weights (ModelSession::load; its errors) and prints the one-line summary of what loading
/// converted, and any warnings, to stderr. For a `reference` (reference_load_options) no warning says that
/// --low-bit or --activations has no effect: those options are not the user's flags (note_reference says
/// what the reference is).
void load_session(ModelSession& session, const LoadOptions& options, bool reference = false);

/// Opens and loads the model at `path` with `low_bit` and the model flags (load_options, then load_session).
ModelSession open_session(const std::string& path, const ModelFlags& flags, const std::string& low_bit);

/// Opens `parts` of the model at `path` on `pool` and loads it with `options` (load_session): eval and explain
/// (ModelSession::Parts::kTokenizer; a reference and a candidate may share the pool) and bench (kConfigOnly).
ModelSession open_scoring_session(const std::string& path, const LoadOptions& options,
                                  const std::shared_ptr<ThreadPool>& pool,
                                  ModelSession::Parts parts = ModelSession::Parts::kTokenizer);
/// Notes on stderr when a comparison's reference is not a float original:
/// `ref_dir` empty and the model a pre-quantized checkpoint (compared with its
/// own integers), --ref naming the model itself, or --ref a quantized
/// checkpoint. `ref_report` is the loaded reference's.
void note_reference(const std::string& model_dir, const std::string& ref_dir, const LoadReport& ref_report);
/// model_label of a comparison's reference, with " (f32 activations)" when it is the model itself
/// (`self_reference`) with integer layers that multiply f32 inputs (reference_load_options).
std::string reference_label(const std::string& path, const LoadReport& ref_report, bool self_reference);

}  // namespace woq::cli
