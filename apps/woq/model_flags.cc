// Flags and messages shared by the commands that load a model.
#include <filesystem>
#include <limits>
#include <random>

#include <fmt/core.h>

#include "commands.h"
#include "model/load_request.h"

namespace woq::cli {

SamplingParams SamplingFlags::params() const {
  const SamplingParams p{temperature, top_k, top_p, seed >= 0 ? static_cast<std::uint64_t>(seed) : std::random_device{}()};
  validate(p);
  validate(penalties);
  return p;
}

void add_sampling_flags(CLI::App* cmd, SamplingFlags& f) {
  cmd->add_option("--temperature", f.temperature, "Sampling temperature; 0 = greedy")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--top-k", f.top_k, "Sample from the K most likely tokens; 0 = all")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--top-p", f.top_p, "Nucleus sampling: smallest set with probability >= P, in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", f.seed, "Random seed (default: random, printed in the summary)")->check(kNonNegative);
  cmd->add_option("--repeat-penalty", f.penalties.repeat,
                  "Penalize the last --repeat-last-n tokens (prompt included), as llama.cpp: logit > 0 divided by "
                  "it, else multiplied; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", f.penalties.last_n, "Tokens the penalties look back over; 0 = off, -1 = all")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{-1}, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--presence-penalty", f.penalties.presence,
                  "Subtracted from the logit of each token in that window (llama.cpp's; the server's presence_penalty "
                  "counts the completion only, as OpenAI's)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", f.penalties.frequency,
                  "Subtracted per occurrence in that window (llama.cpp's, as --presence-penalty)")
      ->capture_default_str();
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  cmd->add_option("-t,--threads", threads, "Worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(kNonNegative);
}

void add_low_bit_flag(CLI::App* cmd, std::string& low_bit) {
  cmd->add_option("--low-bit", low_bit,
                  "Format of the transformer blocks' linear layers: sym_int4 (default), asym_int4, sym_int8, fp16, "
                  "bf16, fp32, q3_k, q4_k, q5_k (ggml K-quants), q4_1, q5_1 (ggml blocks with a min), or "
                  "llama-quantize's file types q2_k, q3_k_s, "
                  "q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k (a K-quant per layer, by its rule). "
                  "Quantized checkpoints keep their layers; without this flag a quantized GGUF file's float layers "
                  "also run as stored (as llama.cpp runs them)")
      ->check([](const std::string& v) {  // empty means "not given" inside: refuse it as a value
        return v.empty() ? std::string("an empty value (give a format, or leave the flag out)") : std::string();
      });
}

void add_model_and_low_bit(CLI::App* cmd, std::string& model_dir, std::string& low_bit) {
  cmd->add_option("-m,--model", model_dir,
                  "Hugging Face model directory (config.json, *.safetensors, tokenizer.json or tokenizer.model) or "
                  ".gguf file")
      ->required();
  add_low_bit_flag(cmd, low_bit);
}

void add_model_flags(CLI::App* cmd, ModelFlags& flags) {
  CLI::Option* group = cmd->add_option("--group-size", flags.group_size,
                                       "Weights per scale along the input dimension (even for 4-bit types); -1 = per "
                                       "output channel")
                           ->capture_default_str();
  CLI::Option* range = cmd->add_option("--int4-range", flags.int4_range,
                                       "sym_int4 range: full ([-8, 7], ggml Q4_0) or clip ([-7, 7])")
                           ->capture_default_str();
  CLI::Option* rounding = cmd->add_option("--rounding", flags.rounding,
                                          "sym_int4 / sym_int8 rounding: woq (default: fp16-rounded scale, nearest "
                                          "even) or ggml (llama-quantize's Q4_0 / Q8_0 reference rule; group size 32); "
                                          "ggml's block formats (q4_1, q5_1, K-quants) take ggml's only");
  cmd->add_option("--plan", flags.plan,
                  "Each linear layer's format from a plan: a JSON file (woq quantize --target-kl / --target-bpw writes "
                  "one) or a llama-quantize file type (q4_k_m, ...: its rule); instead of --low-bit")
      ->excludes(group)
      ->excludes(range)
      ->excludes(rounding);
  cmd->add_option("--lm-head-low-bit", flags.lm_head_low_bit,
                  "Also convert lm_head to this format (default: keep it as stored)");
  cmd->add_option("--activations", flags.activations,
                  "What integer-format layers multiply their inputs as: int8 (quantized per block of 32, integer dot "
                  "products), int16 (quantized to int16 per 128 inputs, two integer dot products: as accurate as f32, "
                  "decodes at int8's speed), f32 (weights dequantized in the dot product: w4a16/w8a16) or bf16 (inputs "
                  "rounded to bf16, fp32 sums: AVX512_BF16/AMX-BF16 dot products); default: int8 for the 4-bit "
                  "formats and ggml's block formats (q4_1, q5_1, K-quants: Q8_1 / Q8_K, which take int8 or f32 "
                  "only), int16 for sym_int8")
      ->check([](const std::string& v) {  // empty means "not given" inside: refuse it as a value
        return v.empty() ? std::string("an empty value (give int8, int16, f32 or bf16, or leave the flag out)") : std::string();
      });
  cmd->add_option("--numerics", flags.numerics,
                  "How norms, RoPE, SiLU and attention round: ggml (llama.cpp's CPU backend's order: a GGUF file "
                  "of K-quant, q4_1 or q5_1 layers then gives llama.cpp's logits bit for bit; the default for GGUF "
                  "files) or woq (the same bits on every ISA; the default otherwise)")
      ->check(CLI::IsMember({"woq", "ggml"}));
  add_threads_flag(cmd, flags.threads);
}

LoadOptions load_options(const ModelFlags& flags, const std::string& low_bit) {
  std::vector<std::string> notes;
  const LoadOptions options = parse_load_request(
      {low_bit, flags.group_size, flags.int4_range, flags.rounding, flags.lm_head_low_bit, flags.activations, flags.plan,
       flags.numerics},
      &notes);
  for (const std::string& line : notes) fmt::print(stderr, "woq: {}\n", line);
  return options;
}

LoadOptions reference_load_options(const ModelFlags& flags, const std::string& low_bit, bool self_reference) {
  ModelFlags reference = flags;
  reference.plan.clear();  // the candidate's
  LoadOptions options = load_options(reference, low_bit);
  options.activations.reset();
  if (self_reference && options.mix == nullptr && is_float_format(options.linear.type))
    options.activations = Activations::kF32;
  return options;
}

void load_session(ModelSession& session, const LoadOptions& options, bool reference) {
  session.load(options);
  LoadOptions shown = options;
  if (reference) {
    shown.activations.reset();
    shown.linear_is_default = true;
  }
  if (!job().leader()) return;  // every rank of an MPI job loads alike: rank 0 says what it did
  // A pipeline stage loads its share of the blocks only (pipeline_share): rank 0 says what it loaded of them.
  const std::int64_t blocks = session.config.num_hidden_layers;
  const std::int64_t last = options.last_block < 0 ? blocks : options.last_block;
  const std::string stage = options.first_block == 0 && last == blocks
                                ? std::string()
                                : fmt::format(" (rank 0's blocks [{}, {}) of {}; the other ranks load theirs alike)",
                                              options.first_block, last, blocks);
  for (const std::string& line : load_summary(session.report, shown)) fmt::print(stderr, "woq: {}{}\n", line, stage);
}

ModelSession open_session(const std::string& path, const ModelFlags& flags, const std::string& low_bit) {
  const LoadOptions options = load_options(flags, low_bit);
  ModelSession session;
  session.open(path, flags.threads);
  load_session(session, options);
  return session;
}

ModelSession open_scoring_session(const std::string& path, const LoadOptions& options,
                                  const std::shared_ptr<ThreadPool>& pool, ModelSession::Parts parts) {
  ModelSession session;
  session.open(path, pool, parts);
  load_session(session, options);
  return session;
}

void note_reference(const std::string& model_dir, const std::string& ref_dir, const LoadReport& ref_report) {
  if (ref_dir.empty()) {
    if (ref_report.prequantized() && !ref_report.rounded_activations)
      fmt::print(stderr,
                 "woq: note: {} is a quantized checkpoint ({}); without --ref the reference is its own integers "
                 "dequantized (f32 activations), so only the activations can differ. Give the original with --ref "
                 "DIR_OR_FILE.\n",
                 model_dir, ref_report.imported_format);
    else if (ref_report.prequantized())
      fmt::print(stderr,
                 "woq: note: {} is a quantized checkpoint ({}); without --ref the reference is the checkpoint itself "
                 "with rounded activations ({}), so the figures show neither its weights' error nor its activations'. "
                 "Give the original with --ref DIR_OR_FILE.\n",
                 model_dir, ref_report.imported_format, ref_report.activations);
    return;
  }
  std::error_code ec;
  if (std::filesystem::equivalent(model_dir, ref_dir, ec))
    fmt::print(stderr, "woq: note: --ref {} is the model itself\n", ref_dir);
  else if (ref_report.prequantized())
    fmt::print(stderr, "woq: note: the reference {} is itself quantized ({}): the figures compare with it, not with a "
               "float original\n", ref_dir, ref_report.imported_format);
}

std::string reference_label(const std::string& path, const LoadReport& ref_report, bool self_reference) {
  const bool dequantized = self_reference && !ref_report.activations.empty() && !ref_report.rounded_activations;
  return model_label(path, ref_report) + (dequantized ? " (f32 activations)" : "");
}

}  // namespace woq::cli
