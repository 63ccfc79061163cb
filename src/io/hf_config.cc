#include "io/hf_config.h"

#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"

namespace woq {

namespace {

// Field must be a positive integer.
std::int64_t positive(const JsonFields& f, const std::string& key) {
  const std::int64_t v = f.integer(key);
  if (v <= 0) f.field_error(key, fmt::format("must be positive, got {}", v));
  return v;
}

std::vector<std::int64_t> token_ids(const JsonFields& f, const std::string& key) {
  if (!f.has(key)) return {};
  const auto& v = f.json().at(key);
  std::vector<std::int64_t> ids;
  if (v.is_number_integer()) {
    ids.push_back(v.get<std::int64_t>());
  } else if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_number_integer()) f.field_error(key, "must be an integer or a list of integers");
      ids.push_back(e.get<std::int64_t>());
    }
  } else {
    f.field_error(key, "must be an integer or a list of integers");
  }
  return ids;
}

RopeScaling rope_scaling(const JsonFields& f) {
  RopeScaling rs;
  if (!f.has("rope_scaling")) return rs;
  const JsonFields s(f.json().at("rope_scaling"), f.path() + " rope_scaling");
  const std::string type = s.has("rope_type") ? s.string("rope_type", "") : s.string("type", "");
  rs.factor = s.number("factor", 1.0);
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    rs.low_freq_factor = s.number("low_freq_factor", 1.0);
    rs.high_freq_factor = s.number("high_freq_factor", 4.0);
    rs.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    if (rs.high_freq_factor <= rs.low_freq_factor)
      f.field_error("rope_scaling", "needs high_freq_factor > low_freq_factor");
  } else if (type == "default") {
    rs.type = RopeScaling::Type::kNone;
  } else {
    f.field_error("rope_scaling", fmt::format("has type '{}'; supported: linear, llama3", type));
  }
  if (!(rs.factor > 0)) f.field_error("rope_scaling", "needs a positive factor");
  return rs;
}

}  // namespace

ModelConfig read_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path)) fail("{}: not found (is '{}' a Hugging Face model directory?)", path, dir);
  const JsonFields f(read_json_file(path), path);

  ModelConfig c;
  if (f.has("architectures")) {
    const auto& a = f.json().at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      f.field_error("architectures", "must be a non-empty list of strings");
    c.architecture = a[0].get<std::string>();
  } else {
    c.architecture = "LlamaForCausalLM";
  }
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM" &&
      c.architecture != "Qwen2ForCausalLM")
    f.field_error("architectures",
                  fmt::format("is '{}'; supported: LlamaForCausalLM, MistralForCausalLM, "
                              "Qwen2ForCausalLM",
                              c.architecture));

  c.hidden_size = positive(f, "hidden_size");
  c.intermediate_size = positive(f, "intermediate_size");
  c.num_hidden_layers = positive(f, "num_hidden_layers");
  c.num_attention_heads = positive(f, "num_attention_heads");
  c.num_key_value_heads =
      f.has("num_key_value_heads") ? positive(f, "num_key_value_heads") : c.num_attention_heads;
  c.vocab_size = positive(f, "vocab_size");
  if (f.has("max_position_embeddings")) c.max_position_embeddings = positive(f, "max_position_embeddings");
  if (f.has("sliding_window") && f.boolean("use_sliding_window", true))
    c.sliding_window = positive(f, "sliding_window");

  if (c.hidden_size % c.num_attention_heads != 0)
    f.field_error("num_attention_heads",
                  fmt::format("({}) does not divide hidden_size ({})", c.num_attention_heads, c.hidden_size));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.field_error("num_key_value_heads", fmt::format("({}) does not divide num_attention_heads ({})",
                                                     c.num_key_value_heads, c.num_attention_heads));
  c.head_dim = f.has("head_dim") ? positive(f, "head_dim") : c.hidden_size / c.num_attention_heads;
  if (c.head_dim % 2 != 0) f.field_error("head_dim", fmt::format("({}) must be even for RoPE", c.head_dim));

  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.field_error("rms_norm_eps", "must be positive");
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (!(c.rope_theta > 1)) f.field_error("rope_theta", "must be greater than 1");
  c.rope_scaling = rope_scaling(f);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_bias = f.boolean("attention_bias", c.architecture == "Qwen2ForCausalLM");
  if (f.boolean("mlp_bias", false)) f.field_error("mlp_bias", "is true; MLP biases are not supported");

  c.bos_token_id = f.opt_integer("bos_token_id").value_or(-1);
  c.eos_token_ids = token_ids(f, "eos_token_id");

  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    const JsonFields g(read_json_file(gen_path), gen_path);
    if (g.has("bos_token_id")) c.bos_token_id = g.integer("bos_token_id");
    if (g.has("eos_token_id")) c.eos_token_ids = token_ids(g, "eos_token_id");
  }
  for (const auto id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("{}: eos_token_id {} is outside the vocabulary [0, {})", path, id, c.vocab_size);
  return c;
}

}  // namespace woq
