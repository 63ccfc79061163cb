// Every kind of bad checkpoint gives one clear woq::Error naming the file and
// the field or tensor; sharded and half-precision checkpoints load.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

using test::RawTensor;
using test::TempDir;

// A copy of the bundled model, to be damaged by one test.
class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override { test::copy_model(WOQ_MODEL_DIR, dir_.path()); }

  std::string file(const std::string& name) const { return dir_.file(name); }

  // Loads the model and returns the error message ("" if it loaded).
  std::string load_error() {
    try {
      LlamaModel::load(dir_.path(), LoadOptions{}, pool_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  void edit_tensors(const std::function<void(std::vector<RawTensor>&)>& edit) {
    auto tensors = test::read_safetensors(file("model.safetensors"));
    edit(tensors);
    test::write_safetensors(file("model.safetensors"), tensors);
  }

  void edit_config(const std::string& from, const std::string& to) {
    std::string cfg = test::read_file(file("config.json"));
    const auto pos = cfg.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    cfg.replace(pos, from.size(), to);
    test::write_file(file("config.json"), cfg);
  }

  // Replaces `from` with `to` (same length) inside the safetensors header.
  void patch_header(const std::string& from, const std::string& to) {
    ASSERT_EQ(from.size(), to.size());
    std::string data = test::read_file(file("model.safetensors"));
    const auto pos = data.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    data.replace(pos, from.size(), to);
    test::write_file(file("model.safetensors"), data);
  }

  TempDir dir_;
  ThreadPool pool_{2};
};

#define EXPECT_MENTIONS(msg, a, b)                                   \
  do {                                                               \
    const std::string m_ = (msg);                                    \
    EXPECT_NE(m_.find(a), std::string::npos) << "message: " << m_;   \
    EXPECT_NE(m_.find(b), std::string::npos) << "message: " << m_;   \
  } while (0)

TEST_F(BadInputTest, BundledModelLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(BadInputTest, MissingSafetensors) {
  std::filesystem::remove(file("model.safetensors"));
  EXPECT_MENTIONS(load_error(), dir_.path(), "no model.safetensors");
}

TEST_F(BadInputTest, TruncatedData) {
  const std::string data = test::read_file(file("model.safetensors"));
  test::write_file(file("model.safetensors"), data.substr(0, data.size() / 2));
  EXPECT_MENTIONS(load_error(), "model.safetensors", "past the end of the data");
}

TEST_F(BadInputTest, TruncatedInsideHeader) {
  test::write_file(file("model.safetensors"), test::read_file(file("model.safetensors")).substr(0, 100));
  EXPECT_MENTIONS(load_error(), "model.safetensors", "exceeds the file size");
}

TEST_F(BadInputTest, TooShortForHeaderLength) {
  test::write_file(file("model.safetensors"), "abc");
  EXPECT_MENTIONS(load_error(), "model.safetensors", "truncated");
}

TEST_F(BadInputTest, OffsetsPastEnd) {
  edit_tensors([](auto&) {});
  const std::string data = test::read_file(file("model.safetensors"));
  // Drop the last 4 bytes: the last tensor's end offset now points past the end.
  test::write_file(file("model.safetensors"), data.substr(0, data.size() - 4));
  EXPECT_MENTIONS(load_error(), "model.norm.weight", "past the end");
}

// A number JSON cannot hold (nlohmann's out_of_range, not a parse_error) is a clear error too (found by fuzz/).
TEST_F(BadInputTest, HeaderNumberOutOfRange) {
  patch_header(R"({"format":"pt"})", R"({"formt":1E400})");
  EXPECT_MENTIONS(load_error(), "model.safetensors", "malformed JSON header");
}

TEST_F(BadInputTest, UnknownDtype) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.0.mlp.up_proj.weight") x.dtype = "F8_E9";
  });
  EXPECT_MENTIONS(load_error(), "model.layers.0.mlp.up_proj.weight", "unsupported dtype 'F8_E9'");
}

TEST_F(BadInputTest, IntegerDtypeForWeights) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.1.self_attn.v_proj.weight") x.dtype = "I32";
  });
  EXPECT_MENTIONS(load_error(), "model.layers.1.self_attn.v_proj.weight", "dtype I32");
}

TEST_F(BadInputTest, SizeDisagreesWithShape) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.2.mlp.down_proj.weight") x.shape = {64, 171};
  });
  EXPECT_MENTIONS(load_error(), "model.layers.2.mlp.down_proj.weight", "needs");
}

TEST_F(BadInputTest, WrongShape) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.3.mlp.gate_proj.weight") x.shape = {64, 172};
  });
  const std::string msg = load_error();
  EXPECT_MENTIONS(msg, "model.layers.3.mlp.gate_proj.weight", "has shape [64, 172], expected [172, 64]");
  EXPECT_MENTIONS(msg, "intermediate_size", "model.safetensors");
  EXPECT_MENTIONS(msg, "(from config.json", "model.safetensors");
}

TEST_F(BadInputTest, MissingTensor) {
  edit_tensors([](auto& t) {
    std::erase_if(t, [](const RawTensor& x) { return x.name == "model.layers.4.self_attn.o_proj.weight"; });
  });
  EXPECT_MENTIONS(load_error(), "model.layers.4.self_attn.o_proj.weight", "missing");
}

TEST_F(BadInputTest, NonFiniteWeight) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.0.self_attn.q_proj.weight") {
        const float inf = std::numeric_limits<float>::infinity();
        std::memcpy(x.bytes.data() + 4 * 70, &inf, 4);
      }
  });
  EXPECT_MENTIONS(load_error(), "model.layers.0.self_attn.q_proj.weight", "row 1, column 6");
}

TEST_F(BadInputTest, OverlappingTensors) {
  // Point model.norm.weight (64 floats) at the first 256 bytes of the data.
  const std::string data = test::read_file(file("model.safetensors"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(data[static_cast<std::size_t>(i)]);
  auto header = nlohmann::json::parse(data.substr(8, n));
  header["model.norm.weight"]["data_offsets"] = {0, 256};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  test::write_file(file("model.safetensors"), out + h + data.substr(8 + n));
  EXPECT_MENTIONS(load_error(), "model.safetensors", "overlapping tensors");
}

TEST_F(BadInputTest, TrailingBytes) {
  test::write_file(file("model.safetensors"), test::read_file(file("model.safetensors")) + "junk");
  EXPECT_MENTIONS(load_error(), "model.safetensors", "the tensors cover");
}

TEST_F(BadInputTest, NonFiniteNormWeight) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.norm.weight") {
        const float nan = std::nanf("");
        std::memcpy(x.bytes.data() + 4 * 3, &nan, 4);
      }
  });
  EXPECT_MENTIONS(load_error(), "model.norm.weight", "at index 3");
}

// GPTQ refuses a NaN weight as RTN does (it wrote a checkpoint before: found by the attack review).
TEST_F(BadInputTest, GptqRefusesNonFiniteWeights) {
  edit_tensors([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.1.self_attn.q_proj.weight") {  // stories260K: F32, K = 64
        const float nan = std::nanf("");
        std::memcpy(x.bytes.data() + 4 * (2 * 64 + 13), &nan, 4);
      }
  });
  const test::TempDir out;
  const int rc = std::system(fmt::format("{} quantize -m {} -o {} --method gptq --nsamples 2 --seqlen 16 -t 1 > {} 2>&1",
                                         WOQ_BIN, dir_.path(), out.file("gptq"), out.file("log")).c_str());
  EXPECT_NE(rc, 0);
  EXPECT_MENTIONS(test::read_file(out.file("log")), "model.layers.1.self_attn.q_proj.weight", "holds nan at row 2, column 13");
  EXPECT_FALSE(std::filesystem::exists(out.file("gptq")));
}

TEST_F(BadInputTest, CheckpointHasMoreLayersThanConfig) {
  edit_config("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 3");
  EXPECT_MENTIONS(load_error(), "model.layers.3.", "num_hidden_layers = 3");
}

TEST_F(BadInputTest, UnsupportedActivationAndAbsurdSizes) {
  edit_config("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
  EXPECT_MENTIONS(load_error(), "config.json", "'hidden_act' is 'gelu'");
  edit_config("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"silu\"");
  edit_config("\"head_dim\": 8", "\"head_dim\": 4000000000");
  EXPECT_MENTIONS(load_error(), "config.json", "'head_dim' is 4000000000, more than");
}

// Values nested deeper than kMaxJsonFileDepth are refused before parsing: copying one (as reading
// quantization_config did) recursed once per level and overflowed the stack at 10^6 levels.
TEST_F(BadInputTest, DeeplyNestedJsonValue) {
  edit_config("\"hidden_size\": 64", "\"hidden_size\": " + std::string(257, '[') + std::string(257, ']'));
  EXPECT_MENTIONS(load_error(), "config.json", "nested deeper than 256 levels");
  edit_config("\"hidden_size\": " + std::string(257, '[') + std::string(257, ']'),
              "\"hidden_size\": 64, \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"meta\": " +
                  std::string(1000000, '[') + std::string(1000000, ']') + "}");
  EXPECT_MENTIONS(load_error(), "config.json", "nested deeper than 256 levels");
  // 256 levels, and brackets inside strings, are fine.
  edit_config("\"meta\": " + std::string(1000000, '[') + std::string(1000000, ']'),
              "\"meta\": {\"quantizer\": \"[[[[{{{{\\\"[[\", \"x\": " + std::string(250, '[') + std::string(250, ']') + "}");
  EXPECT_EQ(load_error(), "");  // (the float layers load as such beside a quantization_config)
}

TEST_F(BadInputTest, FifoInsteadOfFile) {
  std::filesystem::remove(file("model.safetensors"));
  ASSERT_EQ(mkfifo(file("model.safetensors").c_str(), 0600), 0);
  EXPECT_MENTIONS(load_error(), "model.safetensors", "not a regular file");
  std::filesystem::remove(file("config.json"));
  ASSERT_EQ(mkfifo(file("config.json").c_str(), 0600), 0);
  EXPECT_MENTIONS(load_error(), "config.json", "not a regular file");
}

TEST_F(BadInputTest, MalformedHeaderJson) {
  patch_header("\"dtype\"", "\"dtype'");
  EXPECT_MENTIONS(load_error(), "model.safetensors", "malformed JSON header");
}

TEST_F(BadInputTest, MalformedConfigJson) {
  const std::string cfg = test::read_file(file("config.json"));
  test::write_file(file("config.json"), cfg.substr(0, cfg.size() / 2));
  EXPECT_MENTIONS(load_error(), "config.json", "malformed JSON");
}

TEST_F(BadInputTest, HeadsDoNotDivideHidden) {
  edit_config("\"head_dim\": 8,", "");
  edit_config("\"num_attention_heads\": 8", "\"num_attention_heads\": 7");
  EXPECT_MENTIONS(load_error(), "config.json", "'num_attention_heads' (7) does not divide hidden_size (64) and there is no head_dim");
}

// With head_dim given, q_dim = heads * head_dim need not be hidden_size (Qwen3-0.6B), so the
// tensors' shapes are what disagree.
TEST_F(BadInputTest, HeadDimInconsistentWithTensors) {
  edit_config("\"head_dim\": 8,", "\"head_dim\": 16,");
  EXPECT_MENTIONS(load_error(), "self_attn.q_proj.weight", "num_attention_heads * head_dim");
}

TEST_F(BadInputTest, UnsupportedArchitectureFeatures) {
  edit_config("\"head_dim\": 8,", "\"head_dim\": 8, \"num_local_experts\": 8,");
  EXPECT_MENTIONS(load_error(), "'num_local_experts'", "mixture-of-experts");
  edit_config("\"num_local_experts\": 8,", "");
  edit_config("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
  EXPECT_MENTIONS(load_error(), "'rope_scaling'", "has type 'yarn'; supported: linear, llama3");
  edit_config("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "\"rope_scaling\": null");
  edit_config("\"LlamaForCausalLM\"", "\"Qwen2MoeForCausalLM\"");
  EXPECT_MENTIONS(load_error(), "Qwen2MoeForCausalLM", "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM");
}

TEST_F(BadInputTest, FusedQkvProjection) {
  auto tensors = test::read_safetensors(file("model.safetensors"));
  for (auto& t : tensors)
    if (t.name == "model.layers.0.self_attn.q_proj.weight") t.name = "model.layers.0.self_attn.qkv_proj.weight";
  test::write_safetensors(file("model.safetensors"), tensors);
  EXPECT_MENTIONS(load_error(), "model.layers.0.self_attn.qkv_proj.weight", "fused projection");
}

// Token ids of the wrong type or outside the vocabulary, in generation_config.json or config.json,
// are refused naming the file and the field (an empty bos_token_id list once crashed every command).
TEST_F(BadInputTest, MistypedTokenIds) {
  struct Case {
    const char* generation_config;
    const char* want;
  };
  const Case cases[] = {
      {R"({"bos_token_id": [], "eos_token_id": 2})", "field 'bos_token_id' must be an integer token id, got []"},
      {R"({"bos_token_id": [1]})", "field 'bos_token_id' must be an integer token id, got an array of 1 elements"},
      {R"({"bos_token_id": {}})", "field 'bos_token_id' must be an integer token id, got {}"},
      {R"({"bos_token_id": "1"})", "field 'bos_token_id' must be an integer token id, got \"1\""},
      {R"({"bos_token_id": 1.0})", "field 'bos_token_id' must be an integer token id, got 1.0"},
      {R"({"bos_token_id": true})", "field 'bos_token_id' must be an integer token id, got true"},
      {R"({"bos_token_id": 512})", "field 'bos_token_id' is 512, outside the vocabulary [0, 512)"},
      {R"({"bos_token_id": -1})", "field 'bos_token_id' is -1, outside the vocabulary [0, 512)"},
      {R"({"eos_token_id": []})", "field 'eos_token_id' must be an integer token id or a non-empty list of them, got []"},
      {R"({"eos_token_id": "2"})", "field 'eos_token_id' must be an integer token id or a non-empty list of them, got \"2\""},
      {R"({"eos_token_id": [2, "x"]})", "field 'eos_token_id' [1] must be an integer token id, got \"x\""},
      {R"({"eos_token_id": [2, []]})", "field 'eos_token_id' [1] must be an integer token id, got []"},
      {R"({"eos_token_id": [2, -1]})", "field 'eos_token_id' [1] is -1, outside the vocabulary [0, 512)"},
      {R"({"eos_token_id": 18446744073709551615})", "field 'eos_token_id' is 18446744073709551615, outside the vocabulary"},
      {R"([])", "expected a JSON object at the top level, got array"},
  };
  for (const Case& c : cases) {
    test::write_file(file("generation_config.json"), c.generation_config);
    EXPECT_MENTIONS(load_error(), "generation_config.json: ", c.want);
  }
  test::write_file(file("generation_config.json"), R"({"bos_token_id": null, "eos_token_id": 2})");
  edit_config("\"bos_token_id\": 1", "\"bos_token_id\": []");
  EXPECT_MENTIONS(load_error(), "config.json: ", "field 'bos_token_id' must be an integer token id, got []");
  edit_config("\"bos_token_id\": []", "\"bos_token_id\": 1");
  edit_config("\"eos_token_id\": 2", "\"eos_token_id\": [2, 600]");
  EXPECT_MENTIONS(load_error(), "config.json: ", "field 'eos_token_id' [1] is 600, outside the vocabulary [0, 512)");
}

// What transformers accepts loads: eos_token_id a number or a list, null for none.
TEST_F(BadInputTest, TokenIdsOfEveryAcceptedForm) {
  test::write_file(file("generation_config.json"), R"({"bos_token_id": 0, "eos_token_id": 2})");
  EXPECT_EQ(read_model_config(dir_.path()).bos_token_id, 0);
  EXPECT_EQ(read_model_config(dir_.path()).eos_token_ids, std::vector<std::int64_t>{2});
  test::write_file(file("generation_config.json"), R"({"bos_token_id": null, "eos_token_id": [2, 511]})");
  EXPECT_EQ(read_model_config(dir_.path()).bos_token_id, 1);  // config.json's
  EXPECT_EQ(read_model_config(dir_.path()).eos_token_ids, (std::vector<std::int64_t>{2, 511}));
  EXPECT_EQ(load_error(), "");
}

TEST_F(BadInputTest, KvHeadsDoNotDivideHeads) {
  edit_config("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3");
  EXPECT_MENTIONS(load_error(), "config.json", "'num_key_value_heads' (3) does not divide num_attention_heads (8)");
  edit_config("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 16");
  EXPECT_MENTIONS(load_error(), "config.json", "'num_key_value_heads' (16) does not divide num_attention_heads (8)");
}

// Head splits whose tensors could still have the right shapes: without head_dim, heads * (hidden / heads)
// must be hidden; with it (Qwen3), heads * head_dim need not be.
TEST_F(BadInputTest, HeadSplitWithoutHeadDim) {
  edit_config("\"head_dim\": 8,", "");
  EXPECT_EQ(load_error(), "");
  edit_config("\"num_attention_heads\": 8", "\"num_attention_heads\": 6");  // 6 * 10 = 60 != 64
  EXPECT_MENTIONS(load_error(), "config.json: ", "'num_attention_heads' (6) does not divide hidden_size (64) and there is no head_dim");
  edit_config("\"num_attention_heads\": 6", "\"num_attention_heads\": 128");  // head_dim 0
  EXPECT_MENTIONS(load_error(), "config.json: ", "'num_attention_heads' (128) does not divide hidden_size (64)");
  edit_config("\"num_attention_heads\": 128", "\"num_attention_heads\": 64");  // head_dim 1: odd
  edit_config("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 8");
  EXPECT_MENTIONS(load_error(), "config.json: ", "'head_dim' (1) must be even for RoPE");
}

TEST_F(BadInputTest, ExplicitHeadDimNeedNotMatchHidden) {
  edit_config("\"num_attention_heads\": 8", "\"num_attention_heads\": 4");
  edit_config("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 2");
  edit_config("\"head_dim\": 8,", "\"head_dim\": 32,");
  const ModelConfig c = read_model_config(dir_.path());
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_MENTIONS(load_error(), "self_attn.q_proj.weight", "has shape [64, 64], expected [128, 64]");  // the tensors disagree
}

// Sizes that are not positive or beyond any real model, and non-physical rope_theta / rms_norm_eps.
TEST_F(BadInputTest, AbsurdConfigValues) {
  struct Case {
    const char* from;
    const char* to;
    const char* want;
  };
  const Case cases[] = {
      {"\"hidden_size\": 64", "\"hidden_size\": 0", "field 'hidden_size' must be positive, got 0"},
      {"\"hidden_size\": 64", "\"hidden_size\": -64", "field 'hidden_size' must be positive, got -64"},
      {"\"intermediate_size\": 172", "\"intermediate_size\": 0", "field 'intermediate_size' must be positive, got 0"},
      {"\"num_hidden_layers\": 5", "\"num_hidden_layers\": 0", "field 'num_hidden_layers' must be positive, got 0"},
      {"\"num_hidden_layers\": 5", "\"num_hidden_layers\": 5000", "field 'num_hidden_layers' is 5000, more than the 4096 woq accepts"},
      {"\"num_attention_heads\": 8", "\"num_attention_heads\": -8", "field 'num_attention_heads' must be positive, got -8"},
      {"\"num_key_value_heads\": 4", "\"num_key_value_heads\": 0", "field 'num_key_value_heads' must be positive, got 0"},
      {"\"head_dim\": 8", "\"head_dim\": 0", "field 'head_dim' must be positive, got 0"},
      {"\"vocab_size\": 512", "\"vocab_size\": 0", "field 'vocab_size' must be positive, got 0"},
      {"\"vocab_size\": 512", "\"vocab_size\": 16777217", "field 'vocab_size' is 16777217, more than the 16777216 woq accepts"},
      {"\"vocab_size\": 512", "\"vocab_size\": 1e3", "field 'vocab_size' must be an integer, got 1000.0"},
      {"\"max_position_embeddings\": 512", "\"max_position_embeddings\": 0", "field 'max_position_embeddings' must be positive, got 0"},
      {"\"max_position_embeddings\": 512", "\"max_position_embeddings\": 16777217",
       "field 'max_position_embeddings' is 16777217, more than the 16777216 woq accepts"},
      {"\"max_position_embeddings\": 512", "\"max_position_embeddings\": 18446744073709551615",
       "field 'max_position_embeddings' is too large: 18446744073709551615"},
      {"\"rope_theta\": 10000.0", "\"rope_theta\": 0", "field 'rope_theta' must be in (1, 1e12), got 0"},
      {"\"rope_theta\": 10000.0", "\"rope_theta\": -10000.0", "field 'rope_theta' must be in (1, 1e12), got -10000"},
      {"\"rope_theta\": 10000.0", "\"rope_theta\": 1e300", "field 'rope_theta' must be in (1, 1e12), got 1e+300"},
      {"\"rope_theta\": 10000.0", "\"rope_theta\": \"10000\"", "field 'rope_theta' must be a number, got \"10000\""},
      {"\"rope_theta\": 10000.0", "\"rope_theta\": NaN", "malformed JSON"},  // JSON has no NaN or Infinity
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", "field 'rms_norm_eps' must be in (0, 0.1], got 0"},
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1e-05", "field 'rms_norm_eps' must be in (0, 0.1], got -1e-05"},
      {"\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"original_max_position_embeddings\": 1099511627776}",
       "'rope_scaling' needs 0 < low_freq_factor < high_freq_factor <= 1024 and original_max_position_embeddings in [1, 16777216]"},
      {"\"rope_scaling\": null",
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 1e300, "
       "\"original_max_position_embeddings\": 8192}",
       "'rope_scaling' needs 0 < low_freq_factor < high_freq_factor <= 1024"},
  };
  const std::string original = test::read_file(file("config.json"));
  for (const Case& c : cases) {
    edit_config(c.from, c.to);
    EXPECT_MENTIONS(load_error(), "config.json: ", c.want);
    test::write_file(file("config.json"), original);
  }
  EXPECT_EQ(load_error(), "");
}

TEST_F(BadInputTest, MistypedField) {
  edit_config("\"hidden_size\": 64", "\"hidden_size\": \"64\"");
  EXPECT_MENTIONS(load_error(), "config.json", "'hidden_size' must be an integer");
}

TEST_F(BadInputTest, UnsupportedArchitecture) {
  edit_config("LlamaForCausalLM", "GPT2LMHeadModel");
  EXPECT_MENTIONS(load_error(), "config.json", "GPT2LMHeadModel");
}

TEST_F(BadInputTest, MissingLmHeadWhenUntied) {
  edit_config("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
  EXPECT_MENTIONS(load_error(), "lm_head.weight", "tie_word_embeddings");
}

TEST_F(BadInputTest, BadTokenizerModel) {
  test::write_file(file("tokenizer.model"), "this is not a protobuf");
  try {
    Tokenizer::load(dir_.path());
    FAIL() << "garbage tokenizer.model accepted";
  } catch (const Error& e) {
    EXPECT_MENTIONS(std::string(e.what()), "tokenizer.model", "not a SentencePiece model");
  }
}

TEST_F(BadInputTest, TokenOutOfVocabulary) {
  auto model = LlamaModel::load(dir_.path(), LoadOptions{}, pool_);
  KVCache cache = model->make_cache(8);
  std::vector<float> logits;
  const std::vector<std::int32_t> bad = {1, 512};
  EXPECT_THROW(model->forward(bad, cache, false, logits), Error);
  EXPECT_THROW(model->make_cache(513), Error);  // beyond max_position_embeddings
}

// Logits of a fixed prompt, all positions.
std::vector<float> logits_of(const std::string& dir, LowBit type, ThreadPool& pool) {
  auto model = LlamaModel::load(dir, LoadOptions{{type, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}, pool);
  KVCache cache = model->make_cache(16);
  std::vector<float> logits;
  const std::vector<std::int32_t> ids = {1, 403, 407, 261, 378, 432};
  model->forward(ids, cache, true, logits);
  return logits;
}

TEST_F(BadInputTest, ShardedCheckpointMatchesSingleFile) {
  const auto single = logits_of(dir_.path(), LowBit::kFp32, pool_);
  const auto tensors = test::read_safetensors(file("model.safetensors"));
  std::vector<RawTensor> a(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(tensors.size() / 2));
  std::vector<RawTensor> b(tensors.begin() + static_cast<std::ptrdiff_t>(tensors.size() / 2), tensors.end());
  test::write_safetensors(file("model-00001-of-00002.safetensors"), a);
  test::write_safetensors(file("model-00002-of-00002.safetensors"), b);
  nlohmann::json index;
  for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  test::write_file(file("model.safetensors.index.json"), index.dump());
  std::filesystem::remove(file("model.safetensors"));
  EXPECT_EQ(logits_of(dir_.path(), LowBit::kFp32, pool_), single);

  index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  test::write_file(file("model.safetensors.index.json"), index.dump());
  EXPECT_MENTIONS(load_error(), "model-00003-of-00002.safetensors", "cannot open");
}

// F16 and BF16 checkpoints load; their logits track the F32 ones to the
// precision of the dtype.
TEST_F(BadInputTest, HalfPrecisionCheckpoints) {
  const auto f32 = logits_of(dir_.path(), LowBit::kFp32, pool_);
  for (const std::string dtype : {"F16", "BF16"}) {
    TempDir half;
    test::copy_model(WOQ_MODEL_DIR, half.path());
    auto tensors = test::read_safetensors(half.file("model.safetensors"));
    for (auto& t : tensors) {
      std::vector<std::uint8_t> out(t.bytes.size() / 2);
      for (std::size_t i = 0; i < out.size() / 2; ++i) {
        float v;
        std::memcpy(&v, t.bytes.data() + 4 * i, 4);
        const std::uint16_t h = dtype == "F16" ? fp32_to_fp16(v) : fp32_to_bf16(v);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      t.bytes = out;
      t.dtype = dtype;
    }
    test::write_safetensors(half.file("model.safetensors"), tensors);
    const auto got = logits_of(half.path(), LowBit::kFp32, pool_);
    ASSERT_EQ(got.size(), f32.size());
    double max_diff = 0;
    for (std::size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - f32[i])));
    EXPECT_LT(max_diff, dtype == "F16" ? 0.05 : 0.5) << dtype;
    EXPECT_GT(max_diff, 0.0) << dtype << " weights were not actually rounded";
  }
}

}  // namespace
}  // namespace woq
