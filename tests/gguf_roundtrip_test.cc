// Hugging Face checkpoint -> GGUF (quantize/gguf_export.h) -> woq, for every
// architecture: F32 files give bit-identical logits; Q4_0 / Q8_0 files give
// the logits of woq's in-memory sym_int4 / sym_int8 group 32 with the same
// rounding (woq's or ggml's); the tokenizer and chat template survive; an
// independent NumPy reader (tests/reference/gguf_reader.py) sees llama.cpp's
// names, types and keys, and dequantizes the blocks to exactly woq's values.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/gguf_writer.h"
#include "io/hf_config_writer.h"
#include "io/json_file.h"
#include "io/quantized_checkpoint.h"
#include "core/half.h"
#include "formats/kquant.h"
#include "model/llama.h"
#include "model/load_request.h"
#include "model/random_checkpoint.h"
#include "quantize/gguf_export.h"
#include "quantize/quantize_checkpoint.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

constexpr double kWeightStd = 0.3;  // logits with clear margins: a wrong row order changes them grossly

std::string write_model(const test::TempDir& tmp, const std::string& preset, DType dtype) {
  ThreadPool pool(2);
  RandomCheckpointOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.seed = 5;
  o.weight_std = kWeightStd;
  const std::string dir = tmp.file(preset);
  write_random_checkpoint(dir, o, pool);
  return dir;
}

std::string export_to(const std::string& in, const std::string& out, LowBit type, Rounding rounding) {
  ThreadPool pool(2);
  GgufExportOptions o;
  o.type = type;
  o.rounding = rounding;
  export_gguf(in, out, o, pool);
  return out;
}

// Logits of every position of a fixed sequence (shorter than every sliding window: GGUF stores none).
std::vector<float> logits_of(const std::string& model, const QuantSpec& linear,
                             std::optional<Activations> activations = std::nullopt) {
  ThreadPool pool(2);
  LoadOptions options{linear, std::nullopt, activations, {}};
  options.numerics = Numerics::kWoq;  // GGUF files and directories alike: the weights are what is compared
  auto m = LlamaModel::load(model, options, pool);
  std::mt19937 rng(11);
  std::vector<std::int32_t> ids(10);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 500);
  KVCache cache = m->make_cache(static_cast<std::int64_t>(ids.size()));
  std::vector<float> logits;
  m->forward(ids, cache, true, logits);
  return logits;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const QuantSpec kFp32{LowBit::kFp32, 32, Int4Range::kFull, Rounding::kWoq};

class GgufRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufRoundTrip, Fp32FileGivesBitIdenticalLogits) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, GetParam(), DType::kF32);
  const std::string gguf = export_to(dir, tmp.file("m.gguf"), LowBit::kFp32, Rounding::kWoq);
  const std::vector<float> want = logits_of(dir, kFp32);
  EXPECT_TRUE(bit_identical(logits_of(gguf, kFp32), want));
  // The file is a different model unless its q/k rows come back in Hugging Face order: the check can fail.
  const GgufFile file(gguf);
  const ModelConfig c = read_model_config(gguf);
  EXPECT_EQ(file.get_string("general.architecture").value(),
            c.architecture == "Qwen2ForCausalLM" ? "qwen2" : c.architecture == "Qwen3ForCausalLM" ? "qwen3" : "llama");
}

// The presets whose GGUF import the next tests check: the import is the same for every architecture but the
// q/k order, which tiny-mistral (permuted, GQA) and tiny-qwen3 (kept) cover; the 128 K / 151 K vocabularies of
// tiny-llama3 and tiny-qwen2 would cost minutes under ASan, and tiny's K = 344 is not a multiple of 32 (see
// KNotAMultipleOf32).
class GgufImport : public GgufRoundTrip {};

TEST_P(GgufImport, Q4_0AndQ8_0FilesGiveTheInMemoryFormatsLogits) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, GetParam(), DType::kF16);
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kSymInt8}) {
    for (const Rounding rounding : {Rounding::kWoq, Rounding::kGgml}) {
      SCOPED_TRACE(fmt::format("{} {} rounding", low_bit_name(type), rounding_name(rounding)));
      const std::string gguf = export_to(dir, tmp.file(fmt::format("{}-{}.gguf", low_bit_name(type), rounding_name(rounding))),
                                         type, rounding);
      const QuantSpec in_memory{type, 32, Int4Range::kFull, rounding};
      // A file's blocks meet int8 activations by default (llama.cpp's Q8_0), the in-memory sym_int8 int16 ones.
      const std::vector<float> want = logits_of(dir, in_memory, Activations::kInt8);
      EXPECT_TRUE(bit_identical(logits_of(gguf, kFp32), want));  // the file's blocks are used as stored
      if (type == LowBit::kSymInt8) {
        EXPECT_FALSE(bit_identical(logits_of(dir, in_memory), want));
      }
      // The other rounding gives other logits: the comparison sees the rule.
      const QuantSpec other{type, 32, Int4Range::kFull, rounding == Rounding::kWoq ? Rounding::kGgml : Rounding::kWoq};
      EXPECT_FALSE(bit_identical(logits_of(dir, other, Activations::kInt8), want));
    }
  }
}

TEST_P(GgufRoundTrip, TokenizerAndChatTemplateSurvive) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, GetParam(), DType::kF16);
  const std::string gguf = export_to(dir, tmp.file("m.gguf"), LowBit::kSymInt4, Rounding::kWoq);
  const Tokenizer a = Tokenizer::load(dir), b = Tokenizer::load(gguf);
  // stories260K's tokenizer.model collapses runs of spaces, which a GGUF vocabulary cannot express (export notes it).
  const bool collapses = std::string(GetParam()) == "tiny";
  for (const char* text : {"Hello world", " leading space and  two", "Ünïcödé 日本語 🙂 123456789 don't", "a\n\nb\tc"}) {
    if (collapses && std::string_view(text).find("  ") != std::string_view::npos) continue;
    EXPECT_EQ(a.encode(text, true), b.encode(text, true)) << text;
    EXPECT_EQ(a.decode(a.encode(text, true)), b.decode(b.encode(text, true))) << text;
  }
  const char* special = collapses ? "<s>special <|im_start|> text</s>" : "<s> special <|im_start|> text </s>";
  EXPECT_EQ(a.encode(special, true), b.encode(special, true));
  EXPECT_EQ(a.add_bos(), b.add_bos());
  EXPECT_EQ(read_model_config(dir).eos_token_ids.front(), read_model_config(gguf).eos_token_ids.front());
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}])");
  const ChatTemplate ta = ChatTemplate::load(dir), tb = ChatTemplate::load(gguf);
  EXPECT_EQ(ta.is_default(), tb.is_default());
  EXPECT_EQ(ta.render(messages, true), tb.render(messages, true));
}

// woq quantize from a GGUF to GPTQ: config.json, tokenizer files and tensors written from the GGUF equal
// those written from the Hugging Face directory the GGUF was made of.
TEST_P(GgufImport, GptqFromTheGgufEqualsGptqFromTheDirectory) {
  test::TempDir tmp;
  ThreadPool pool(2);
  const std::string dir = write_model(tmp, GetParam(), DType::kF32);
  const std::string gguf = export_to(dir, tmp.file("m.gguf"), LowBit::kFp32, Rounding::kWoq);
  QuantizeOptions o;
  o.spec = {LowBit::kAsymInt4, 32, Int4Range::kFull, Rounding::kWoq};
  quantize_checkpoint(dir, tmp.file("from_dir"), o, pool);
  const QuantizeReport r = quantize_checkpoint(gguf, tmp.file("from_gguf"), o, pool);
  EXPECT_EQ(r.matrices, 7 * read_model_config(dir).num_hidden_layers);
  const TensorStore a = TensorStore::open(tmp.file("from_dir")), b = TensorStore::open(tmp.file("from_gguf"));
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    const TensorView &ta = a.get(name), &tb = b.get(name);
    EXPECT_EQ(ta.dtype, tb.dtype) << name;
    EXPECT_EQ(ta.shape, tb.shape) << name;
    EXPECT_TRUE(ta.bytes.size() == tb.bytes.size() && std::memcmp(ta.bytes.data(), tb.bytes.data(), ta.bytes.size()) == 0)
        << name;
  }
  const ModelConfig ca = read_model_config(tmp.file("from_dir")), cb = read_model_config(tmp.file("from_gguf"));
  EXPECT_EQ(cb.architecture, read_model_config(gguf).architecture);  // Mistral is "llama" in GGUF: LlamaForCausalLM
  EXPECT_EQ(ca.num_key_value_heads, cb.num_key_value_heads);
  EXPECT_EQ(ca.head_dim, cb.head_dim);
  EXPECT_EQ(static_cast<float>(ca.rms_norm_eps), static_cast<float>(cb.rms_norm_eps));
  EXPECT_EQ(ca.rope_theta, cb.rope_theta);
  EXPECT_EQ(ca.tie_word_embeddings, cb.tie_word_embeddings);
  EXPECT_EQ(ca.bos_token_id, cb.bos_token_id);
  EXPECT_EQ(ca.eos_token_ids.front(), cb.eos_token_ids.front());
  EXPECT_EQ(read_quantization_config(tmp.file("from_gguf"))->describe(), read_quantization_config(tmp.file("from_dir"))->describe());
  EXPECT_TRUE(bit_identical(logits_of(tmp.file("from_gguf"), kFp32), logits_of(tmp.file("from_dir"), kFp32)));
  const Tokenizer ta = Tokenizer::load(tmp.file("from_dir")), tb = Tokenizer::load(tmp.file("from_gguf"));
  for (const char* text : {"Hello world", "Ünïcödé 日本語 🙂 123456789 don't", "a\n\nb\tc", "<s>x<|im_start|>y</s>"})
    EXPECT_EQ(ta.encode(text, true), tb.encode(text, true)) << text;
  EXPECT_EQ(ta.eos_id(), tb.eos_id());
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(ChatTemplate::load(tmp.file("from_dir")).render(messages, true),
            ChatTemplate::load(tmp.file("from_gguf")).render(messages, true));
}

// A Q4_0 GGUF to GPTQ sym_int4 group 32: the blocks become the same integers and scales, so the
// checkpoint computes the GGUF's own logits; the other ggml types around them are written as F32.
TEST(GgufToGptq, Q4_0BlocksBecomeTheSameSymInt4Groups) {
  test::TempDir tmp;
  ThreadPool pool(2);
  const std::string dir = write_model(tmp, "tiny-mistral", DType::kF16);
  const std::string gguf = export_to(dir, tmp.file("q.gguf"), LowBit::kSymInt4, Rounding::kGgml);
  QuantizeOptions o;
  o.spec = {LowBit::kSymInt4, 32, Int4Range::kFull, Rounding::kWoq};
  const QuantizeReport r = quantize_checkpoint(gguf, tmp.file("gptq"), o, pool);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("the GGUF's q4_0 linear layers are dequantized and quantized again"), std::string::npos)
      << r.notes.back();
  EXPECT_TRUE(bit_identical(logits_of(tmp.file("gptq"), kFp32), logits_of(gguf, kFp32)));
  // Group 64 cannot hold Q4_0's scales: other logits (the comparison can fail).
  o.spec.group_size = 64;
  quantize_checkpoint(gguf, tmp.file("gptq64"), o, pool);
  EXPECT_FALSE(bit_identical(logits_of(tmp.file("gptq64"), kFp32), logits_of(gguf, kFp32)));
}

// config.json written from a ModelConfig reads back as it; a GGUF's RoPE factors become the rope_scaling that
// gives them (Llama 3.x: llama3 with its parameters), or an error when none does.
TEST(HfConfigJson, ReadsBackAndRecoversRopeScalingFromFactors) {
  test::TempDir tmp;
  for (const ModelPreset& p : model_presets()) {
    for (const bool as_factors : {false, true}) {
      ModelConfig c = p.config;
      if (as_factors) {
        c.rope_scaling.freq_factors = rope_freq_factors(c);
        c.rope_scaling.type = RopeScaling::Type::kFactors;
      }
      const std::string dir = tmp.file(p.name + (as_factors ? "-factors" : ""));
      std::filesystem::create_directories(dir);
      write_json_file(dir + "/config.json", hf_config_json(c, "float16"));
      const ModelConfig back = read_model_config(dir);
      SCOPED_TRACE(p.name + (as_factors ? " from factors" : ""));
      EXPECT_EQ(back.architecture, p.config.architecture);
      EXPECT_EQ(back.hidden_size, c.hidden_size);
      EXPECT_EQ(back.num_key_value_heads, c.num_key_value_heads);
      EXPECT_EQ(back.head_dim, c.head_dim);
      for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) EXPECT_EQ(back.window(l), c.window(l)) << l;
      EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
      EXPECT_EQ(back.rope_theta, c.rope_theta);
      EXPECT_EQ(back.rope_scaling.type, p.config.rope_scaling.type);
      EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, p.config.rope_scaling.original_max_position_embeddings);
      EXPECT_EQ(rope_freq_factors(back), rope_freq_factors(p.config));
      EXPECT_EQ(back.bos_token_id, c.bos_token_id);
      EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
    }
  }
  // Biases config.json has no switch for, and linear factors below 1 (which no config.json accepts).
  ModelConfig qkv_only = find_preset("tiny").config;
  qkv_only.attention_bias = true;
  EXPECT_THROW(hf_config_json(qkv_only, "float16"), Error);
  ModelConfig shrink = find_preset("tiny").config;
  shrink.rope_scaling.type = RopeScaling::Type::kFactors;
  shrink.rope_scaling.freq_factors.assign(static_cast<std::size_t>(shrink.head_dim / 2), 0.5f);
  EXPECT_THROW(hf_config_json(shrink, "float16"), Error);
  ModelConfig odd = find_preset("tiny-llama3").config;
  odd.rope_scaling.freq_factors = rope_freq_factors(odd);
  odd.rope_scaling.freq_factors[3] *= 1.5f;  // no rule gives these
  odd.rope_scaling.type = RopeScaling::Type::kFactors;
  EXPECT_THROW(
      {
        try {
          hf_config_json(odd, "float16");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("follow no rope_scaling config.json can express"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

INSTANTIATE_TEST_SUITE_P(Presets, GgufRoundTrip,
                         ::testing::Values("tiny", "tiny-llama3", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"));
INSTANTIATE_TEST_SUITE_P(Presets, GgufImport, ::testing::Values("tiny-mistral", "tiny-qwen3"));

// A GPTQ checkpoint (no `.weight` for its linears) is dequantized: written as
// F32, its exact dequantized weights give the checkpoint's own logits bit for
// bit (sym_int8 with f32 activations dequantizes in the dot product in
// dot_f32's order).
TEST(GgufExport, GptqCheckpointIsDequantized) {
  for (const char* preset : {"tiny-mistral", "tiny-qwen2"}) {  // q/k permuted / not, biases
    test::TempDir tmp;
    const std::string dir = write_model(tmp, preset, DType::kF32);
    ThreadPool pool(2);
    QuantizeOptions options;
    options.spec = {LowBit::kSymInt8, -1, Int4Range::kFull};
    quantize_checkpoint(dir, tmp.file("gptq"), options, pool);
    ASSERT_EQ(TensorStore::open(tmp.file("gptq")).find("model.layers.0.self_attn.q_proj.weight"), nullptr);
    GgufExportOptions o;
    o.type = LowBit::kFp32;
    const GgufExportReport r = export_gguf(tmp.file("gptq"), tmp.file("g.gguf"), o, pool);
    EXPECT_GT(r.bytes_before, 0u);
    const std::vector<float> a = logits_of(tmp.file("gptq"), kFp32, Activations::kF32),
                             b = logits_of(tmp.file("g.gguf"), kFp32);
    EXPECT_TRUE(bit_identical(a, b)) << preset;
  }
}

TEST(GgufExport, KNotAMultipleOf32IsWrittenF16) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny", DType::kF16);  // intermediate_size 344
  ThreadPool pool(2);
  GgufExportOptions o;
  const GgufExportReport r = export_gguf(dir, tmp.file("m.gguf"), o, pool);
  const GgufFile f(tmp.file("m.gguf"));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type->type, GgmlType::kF16);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_up.weight")->type->type, GgmlType::kQ4_0);
  const auto noted = [&](std::string_view what) {
    return std::any_of(r.notes.begin(), r.notes.end(), [&](const std::string& n) { return n.find(what) != n.npos; });
  };
  EXPECT_TRUE(noted("blk.0.ffn_down.weight: K = 344 is not a multiple of 32"));
  EXPECT_TRUE(noted("collapses runs of spaces"));  // stories260K's SentencePiece normalizer
  // Refuses to overwrite, and leaves no temporary file behind.
  EXPECT_THROW(export_gguf(dir, tmp.file("m.gguf"), o, pool), Error);
  for (const auto& e : std::filesystem::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

// A quantized GGUF's float layers (the F16 down_proj beside Q4_0 blocks) run as stored unless a format is asked
// for, as llama.cpp runs them; a wholly float GGUF is quantized by default, as a Hugging Face directory is.
TEST(GgufLoad, FloatLayersOfAQuantizedFileRunAsStoredByDefault) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny", DType::kF16);  // intermediate_size 344: down_proj stays F16
  const std::string q4 = export_to(dir, tmp.file("q4.gguf"), LowBit::kSymInt4, Rounding::kWoq);
  const std::string f16 = export_to(dir, tmp.file("f16.gguf"), LowBit::kFp16, Rounding::kWoq);
  ThreadPool pool(2);
  const auto load = [&](const std::string& path, const std::string& low_bit, LoadReport& report) {
    LoadRequest request;
    request.low_bit = low_bit;
    return LlamaModel::load(path, parse_load_request(request), pool, &report);
  };
  LoadReport by_default, asked, float_file;
  const auto m = load(q4, "", by_default);
  EXPECT_EQ(m->block_linear(0, LinearRole::kDown).type, LowBit::kFp16);     // down_proj, as stored
  EXPECT_EQ(m->block_linear(0, LinearRole::kUp).type, LowBit::kSymInt4);  // up_proj, the file's Q4_0
  EXPECT_EQ(by_default.linear_kept_float, m->config().num_hidden_layers);
  EXPECT_EQ(by_default.linear_matrices, 0);
  EXPECT_EQ(load(q4, "sym_int4", asked)->block_linear(0, LinearRole::kDown).type, LowBit::kSymInt4);  // asked for: converted
  EXPECT_EQ(asked.linear_kept_float, 0);
  EXPECT_EQ(asked.converted_roles, std::vector<std::string>{"down"});
  EXPECT_EQ(load(f16, "", float_file)->block_linear(0, LinearRole::kDown).type, LowBit::kSymInt4);  // a float file: the default format
  EXPECT_EQ(float_file.converted_roles, (std::vector<std::string>{"q", "k", "v", "o", "gate", "up", "down"}));
  const auto summary = load_summary(by_default, parse_load_request({}));
  EXPECT_TRUE(std::any_of(summary.begin(), summary.end(), [](const std::string& l) {
    return l.find("float linear layers beside the quantized ones kept as stored") != l.npos;
  }));
}

TEST(GgufExport, GgufInputKeepsItsBlocks) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-llama3", DType::kF16);
  const std::string first = export_to(dir, tmp.file("a.gguf"), LowBit::kSymInt4, Rounding::kGgml);
  const std::string second = export_to(first, tmp.file("b.gguf"), LowBit::kSymInt4, Rounding::kWoq);
  const GgufFile a(first), b(second);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const GgufTensorInfo& t : a.tensors()) {
    const GgufTensorInfo* u = b.find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->type, t.type) << t.name;
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), u->bytes.begin(), u->bytes.end())) << t.name;
  }
  for (const auto& [key, v] : a.metadata()) {
    if (key.starts_with("tokenizer.")) {
      EXPECT_NE(b.find(key), nullptr) << key;
    }
  }
}

// Copies GGUF `in` to `out` with `edit` given each tensor (name, type, bytes) to change in place,
// and `extra` tensors appended (a crafted file for the loader's checks).
using TensorEdit = std::function<void(const std::string& name, GgmlType& type, std::vector<std::uint8_t>& bytes)>;
void rewrite(const std::string& in, const std::string& out, const TensorEdit& edit,
             const std::vector<std::string>& duplicate_as = {}) {
  const GgufFile f(in);
  GgufWriter w;
  for (const auto& [key, v] : f.metadata()) w.set_value(key, v);
  auto add = [&](const GgufTensorInfo& t, const std::string& name) {
    std::vector<std::uint8_t> bytes(t.bytes.begin(), t.bytes.end());
    GgmlType type = t.type->type;
    edit(name, type, bytes);
    w.add_tensor(name, t.ne, type, [bytes](std::span<std::uint8_t> dst) { std::memcpy(dst.data(), bytes.data(), dst.size()); });
  };
  for (const GgufTensorInfo& t : f.tensors()) add(t, t.name);
  for (std::size_t i = 0; i + 1 < duplicate_as.size(); i += 2) add(*f.find_tensor(duplicate_as[i]), duplicate_as[i + 1]);
  w.write(out);
}

// llama.cpp's small tied models (Llama 3.2 1B, Qwen2.5 0.5B) keep token_embd in Q4_0 / Q8_0: it is
// the output projection too, and must be laid out for the kernels.
TEST(GgufLoad, TiedQuantizedEmbeddingRunsAsTheOutputProjection) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-llama3", DType::kF16);  // tied embeddings
  const std::string f16 = export_to(dir, tmp.file("m.gguf"), LowBit::kSymInt4, Rounding::kWoq);
  rewrite(f16, tmp.file("q.gguf"), [](const std::string& name, GgmlType& type, std::vector<std::uint8_t>& bytes) {
    if (name != "token_embd.weight") return;
    std::vector<float> x(bytes.size() / 2);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = fp16_to_fp32(static_cast<std::uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8));
    bytes.assign(x.size() / 32 * 18, 0);
    ggml::quantize_q4_0_ggml(x.data(), static_cast<std::int64_t>(x.size()), bytes.data());
    type = GgmlType::kQ4_0;
  });
  const std::vector<float> logits = logits_of(tmp.file("q.gguf"), kFp32);
  ASSERT_FALSE(logits.empty());
  for (const float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(GgufLoad, NonFiniteBlockScalesAndStrayTensorsAreRefused) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-qwen2", DType::kF16);
  const std::string q4 = export_to(dir, tmp.file("m.gguf"), LowBit::kSymInt4, Rounding::kWoq);
  for (const std::uint16_t bad : {std::uint16_t{0x7e00}, std::uint16_t{0x7c00}}) {  // NaN, +Inf
    rewrite(q4, tmp.file("nan.gguf"), [bad](const std::string& name, GgmlType&, std::vector<std::uint8_t>& bytes) {
      if (name == "blk.1.ffn_up.weight") std::memcpy(bytes.data() + 18 * 3, &bad, 2);  // block 3: row 1, block 1 (K = 64)
    });
    try {
      logits_of(tmp.file("nan.gguf"), kFp32);
      ADD_FAILURE() << "a non-finite scale was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'blk.1.ffn_up.weight' row 1 block 1 has scale"), std::string::npos) << e.what();
    }
  }
  // blk.00.* beside blk.0.*: never read, so refused rather than ignored.
  rewrite(q4, tmp.file("stray.gguf"), [](const std::string&, GgmlType&, std::vector<std::uint8_t>&) {},
          {"blk.0.attn_norm.weight", "blk.00.attn_norm.weight"});
  EXPECT_THROW(logits_of(tmp.file("stray.gguf"), kFp32), Error);
}

// The block type each tensor of a 1-layer `small` model (K = 1024 and 2816: whole super-blocks)
// becomes in the K-quant tests: every format kept as stored (K-quants, q4_1, q5_1), on permuted (q/k)
// and plain rows, embeddings and output.
const std::map<std::string, GgmlType> kKQuantTypes = {
    {"blk.0.attn_q.weight", GgmlType::kQ4_K},      {"blk.0.attn_k.weight", GgmlType::kQ5_K},
    {"blk.0.attn_v.weight", GgmlType::kQ6_K},      {"blk.0.attn_output.weight", GgmlType::kQ3_K},
    {"blk.0.ffn_gate.weight", GgmlType::kQ2_K},    {"blk.0.ffn_up.weight", GgmlType::kQ5_1},
    {"blk.0.ffn_down.weight", GgmlType::kQ6_K},    {"token_embd.weight", GgmlType::kQ4_1},
    {"output.weight", GgmlType::kQ6_K}};

// Writes KQ (the F16 GGUF `f16` with kKQuantTypes' tensors as K-quant super-blocks of random bytes,
// every quant, scale and min pattern, under finite fp16 super-scales N(0, 1e-4)) and TWIN (the same
// tensors as F32: ggml's dequantization of those blocks).
void write_kquant_pair(const std::string& f16, const std::string& kq, const std::string& twin) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1e-4f);
  std::map<std::string, std::vector<std::uint8_t>> blocks;
  rewrite(f16, kq, [&](const std::string& name, GgmlType& type, std::vector<std::uint8_t>& bytes) {
    const auto it = kKQuantTypes.find(name);
    if (it == kKQuantTypes.end()) return;
    const kquant::Format& f = *kquant::find(it->second);
    const std::size_t count = bytes.size() / 2 / static_cast<std::size_t>(f.block);
    bytes.resize(count * static_cast<std::size_t>(f.block_bytes));
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    for (std::size_t b = 0; b < count; ++b)
      for (const std::int64_t offset : {f.d_offset, f.dmin_offset})
        if (offset >= 0) {
          const std::uint16_t h = fp32_to_fp16(normal(rng));
          std::memcpy(bytes.data() + b * static_cast<std::size_t>(f.block_bytes) + static_cast<std::size_t>(offset), &h, 2);
        }
    type = it->second;
    blocks[name] = bytes;
  });
  rewrite(f16, twin, [&](const std::string& name, GgmlType& type, std::vector<std::uint8_t>& bytes) {
    const auto it = blocks.find(name);
    if (it == blocks.end()) return;
    std::vector<float> x(bytes.size() / 2);
    ggml_type_traits(kKQuantTypes.at(name)).to_float(it->second.data(), x.data(), static_cast<std::int64_t>(x.size()));
    bytes.resize(x.size() * 4);
    std::memcpy(bytes.data(), x.data(), bytes.size());
    type = GgmlType::kF32;
  });
}

std::string write_small_f16_gguf(const test::TempDir& tmp) {
  ThreadPool pool(2);
  RandomCheckpointOptions o;
  o.preset = "small";
  o.layers = 1;
  o.seed = 3;
  o.weight_std = kWeightStd;
  write_random_checkpoint(tmp.file("small"), o, pool);
  return export_to(tmp.file("small"), tmp.file("f16.gguf"), LowBit::kFp16, Rounding::kWoq);
}

// GGUF K-quants (and q4_1 / q5_1) run as stored: with f32 activations such a file gives bit for bit
// the logits of its twin holding ggml's dequantization of the same blocks (a wrong layout, row order
// or format changes them grossly); with the default Q8_K / Q8_1 activations (ggml's) nearly those logits.
TEST(GgufLoad, KQuantFileRunsAsItsDequantizedTwin) {
  test::TempDir tmp;
  write_kquant_pair(write_small_f16_gguf(tmp), tmp.file("kq.gguf"), tmp.file("twin.gguf"));
  const std::vector<float> twin = logits_of(tmp.file("twin.gguf"), kFp32);
  EXPECT_TRUE(bit_identical(logits_of(tmp.file("kq.gguf"), kFp32, Activations::kF32), twin));
  const std::vector<float> q8k = logits_of(tmp.file("kq.gguf"), kFp32);
  ASSERT_EQ(q8k.size(), twin.size());
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < twin.size(); ++i) {
    diff += (q8k[i] - twin[i]) * (q8k[i] - twin[i]);
    norm += twin[i] * twin[i];
  }
  EXPECT_FALSE(bit_identical(q8k, twin));
  EXPECT_LT(std::sqrt(diff / norm), 0.05) << "Q8_K activations moved the logits too far";  // 0.024 measured

  ThreadPool pool(2);
  LoadReport rep;
  LlamaModel::load(tmp.file("kq.gguf"), LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool, &rep);
  EXPECT_NE(rep.imported_format.find("GGUF q4_K x1"), std::string::npos) << rep.imported_format;
  EXPECT_NE(rep.imported_format.find("GGUF q5_1 x1"), std::string::npos) << rep.imported_format;
  EXPECT_NE(rep.imported_format.find("GGUF q6_K x2"), std::string::npos) << rep.imported_format;
  EXPECT_NE(rep.activations.find("q2_k q8_K"), std::string::npos) << rep.activations;
  EXPECT_NE(rep.activations.find("q5_1 q8_1"), std::string::npos) << rep.activations;
  // Activations the K-quant kernels do not take are refused, not ignored.
  EXPECT_THROW(LlamaModel::load(tmp.file("kq.gguf"), LoadOptions{kFp32, std::nullopt, Activations::kBf16, {}}, pool), Error);
}

TEST(GgufLoad, NonFiniteKQuantSuperScalesAreRefused) {
  test::TempDir tmp;
  write_kquant_pair(write_small_f16_gguf(tmp), tmp.file("kq.gguf"), tmp.file("twin.gguf"));
  for (const auto& [tensor, offset] : {std::pair<std::string, std::int64_t>{"blk.0.ffn_down.weight", 208},  // q6_K d
                                       {"blk.0.ffn_gate.weight", 82}}) {  // q2_K dmin
    const kquant::Format& f = *kquant::find(kKQuantTypes.at(tensor));
    const std::int64_t per_row = (tensor == "blk.0.ffn_down.weight" ? 2816 : 1024) / 256;
    rewrite(tmp.file("kq.gguf"), tmp.file("nan.gguf"), [&](const std::string& name, GgmlType&, std::vector<std::uint8_t>& bytes) {
      const std::uint16_t inf = 0x7c00;
      if (name == tensor) std::memcpy(bytes.data() + (2 * per_row + 1) * f.block_bytes + offset, &inf, 2);  // row 2, super-block 1
    });
    try {
      logits_of(tmp.file("nan.gguf"), kFp32);
      ADD_FAILURE() << "a non-finite super-scale was accepted in " << tensor;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor '" + tensor + "' row 2 super-block 1 has a NaN or infinite scale"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(GgufExport, NonFiniteWeightsAndSplitNamesAreRefused) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-qwen3", DType::kF32);
  const std::string f32 = export_to(dir, tmp.file("m.gguf"), LowBit::kFp32, Rounding::kWoq);
  rewrite(f32, tmp.file("nan.gguf"), [](const std::string& name, GgmlType&, std::vector<std::uint8_t>& bytes) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (name == "blk.0.ffn_gate.weight") std::memcpy(bytes.data() + 4 * 70, &nan, 4);
  });
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kSymInt8, LowBit::kFp16}) {
    try {
      export_to(tmp.file("nan.gguf"), tmp.file(fmt::format("out-{}.gguf", low_bit_name(type))), type, Rounding::kWoq);
      ADD_FAILURE() << "NaN written as " << low_bit_name(type);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'blk.0.ffn_gate.weight' holds nan"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(tmp.file(fmt::format("out-{}.gguf", low_bit_name(type)))));
  }
  EXPECT_THROW(export_to(dir, tmp.file("m-00001-of-00002.gguf"), LowBit::kSymInt4, Rounding::kWoq), Error);
}

// woq's dequantization of the in-memory matrix behind GGUF tensor `name`, in the file's row order.
std::vector<float> woq_rows(LlamaModel& m, const ModelConfig& c, const std::string& name) {
  const std::string hf = *hf_tensor_name(name);
  const auto layer = std::stoll(hf.substr(std::string("model.layers.").size()));
  LinearRole role = LinearRole::kQ;
  for (const LinearSpec& spec : kBlockLinears)
    if (hf.find(spec.module) != std::string::npos) role = spec.role;
  const QuantMatrix& w = m.block_linear(layer, role);
  std::vector<std::int64_t> hf_row(static_cast<std::size_t>(w.rows));
  for (std::int64_t r = 0; r < w.rows; ++r) hf_row[static_cast<std::size_t>(r)] = r;
  if (role == LinearRole::kQ || role == LinearRole::kK) {  // llama.cpp's order
    const std::vector<std::int64_t> order =
        gguf_qk_row_order(w.rows, role == LinearRole::kQ ? c.num_attention_heads : c.num_key_value_heads);
    for (std::size_t r = 0; r < order.size(); ++r) hf_row[static_cast<std::size_t>(order[r])] = static_cast<std::int64_t>(r);
  }
  std::vector<float> out(static_cast<std::size_t>(w.rows * w.cols));
  for (std::int64_t g = 0; g < w.rows; ++g) dequantize_row(w, hf_row[static_cast<std::size_t>(g)], out.data() + g * w.cols);
  return out;
}

TEST(GgufExport, IndependentReaderSeesLlamaCppsLayoutAndWoqsValues) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-llama3", DType::kF16);
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kSymInt8}) {
    SCOPED_TRACE(low_bit_name(type));
    const std::string gguf = export_to(dir, tmp.file(fmt::format("{}.gguf", low_bit_name(type))), type, Rounding::kWoq);
    const std::string out = tmp.file(fmt::format("{}-read", low_bit_name(type)));
    std::filesystem::create_directory(out);
    const std::string python = test::python();
    const int status = std::system(
        (python + " " WOQ_TEST_SOURCE "/reference/gguf_reader.py " + gguf + " " + out + " 2> " + out + "/err").c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 77 || code == 127) WOQ_SKIP_WITHOUT_REFERENCE(test::python() << " lacks NumPy (bash tools/install-deps.sh)");
    ASSERT_EQ(code, 0) << test::read_file(out + "/err");
    const auto summary = nlohmann::json::parse(test::read_file(out + "/summary.json"));
    const auto& md = summary["metadata"];
    const ModelConfig c = read_model_config(dir);
    EXPECT_EQ(summary["version"], 3);
    EXPECT_EQ(md["general.architecture"], "llama");
    EXPECT_EQ(md["general.file_type"], type == LowBit::kSymInt4 ? 2 : 7);
    EXPECT_EQ(md["llama.block_count"], c.num_hidden_layers);
    EXPECT_EQ(md["llama.embedding_length"], c.hidden_size);
    EXPECT_EQ(md["llama.feed_forward_length"], c.intermediate_size);
    EXPECT_EQ(md["llama.attention.head_count"], c.num_attention_heads);
    EXPECT_EQ(md["llama.attention.head_count_kv"], c.num_key_value_heads);
    EXPECT_EQ(md["llama.context_length"], c.max_position_embeddings);
    EXPECT_FLOAT_EQ(md["llama.rope.freq_base"].get<float>(), static_cast<float>(c.rope_theta));
    EXPECT_EQ(md["tokenizer.ggml.model"], "gpt2");
    EXPECT_EQ(md["tokenizer.ggml.pre"], "llama-bpe");
    EXPECT_EQ(md["tokenizer.ggml.tokens"]["count"], c.vocab_size);
    EXPECT_EQ(md["tokenizer.ggml.bos_token_id"], c.bos_token_id);
    std::map<std::string, nlohmann::json> tensors;
    for (const auto& t : summary["tensors"]) tensors[t["name"].get<std::string>()] = t;
    EXPECT_EQ(tensors.count("output.weight"), 0u);  // tied embeddings
    EXPECT_EQ(tensors["token_embd.weight"]["type"], "F16");
    EXPECT_EQ(tensors["rope_freqs.weight"]["type"], "F32");  // llama3 rope scaling, as llama.cpp stores it
    EXPECT_EQ(tensors["blk.1.attn_output.bias"]["type"], "F32");
    EXPECT_EQ(tensors["blk.0.attn_norm.weight"]["type"], "F32");
    EXPECT_EQ(tensors["blk.0.ffn_gate.weight"]["ne"], nlohmann::json::array({c.hidden_size, c.intermediate_size}));

    ThreadPool pool(2);
    auto m = LlamaModel::load(dir, LoadOptions{{type, 32, Int4Range::kFull, Rounding::kWoq}, std::nullopt, std::nullopt, {}}, pool);
    int checked = 0;
    for (const auto& [name, t] : tensors) {
      if (t["type"] != (type == LowBit::kSymInt4 ? "Q4_0" : "Q8_0")) continue;
      const std::vector<float> want = woq_rows(*m, c, name);
      const std::string bytes = test::read_file(out + "/" + name + ".f32");
      ASSERT_EQ(bytes.size(), want.size() * sizeof(float)) << name;
      EXPECT_EQ(std::memcmp(bytes.data(), want.data(), bytes.size()), 0) << name;
      ++checked;
    }
    EXPECT_EQ(checked, 7 * c.num_hidden_layers);
  }
}

}  // namespace
}  // namespace woq
