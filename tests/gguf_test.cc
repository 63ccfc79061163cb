// The GGUF reader (io/gguf.h) and what woq makes of a GGUF model
// (io/gguf_model.h) against files built here byte by byte from the
// specification (ggml/docs/gguf.md: magic, version, counts, key/value pairs,
// tensor infos, padding to general.alignment, data), independently of the
// reader: every metadata type, v2 and v3, alignments, tensor types and their
// placement, names and shapes as Hugging Face's, llama.cpp's q/k row
// permutation undone, split sets, the ModelConfig, and bad input of every
// kind (each a woq::Error naming what is wrong, never a crash).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "quantize/gguf_export.h"
#include "quantize/quantize_checkpoint.h"
#include "test_files.h"

namespace woq {
namespace {

#define EXPECT_MENTIONS(statement, ...)                                                                           \
  do {                                                                                                            \
    try {                                                                                                         \
      statement;                                                                                                  \
      ADD_FAILURE() << "no error from " #statement;                                                               \
    } catch (const Error& e) {                                                                                    \
      for (const char* part : {__VA_ARGS__})                                                                      \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what(); \
    }                                                                                                             \
  } while (0)

// ------------------------------------------------------------------ the byte builder

static_assert(std::endian::native == std::endian::little, "the builder writes host-order scalars");

template <typename T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}
// gguf_string_t: uint64 length, then the bytes (no terminator).
std::string gstr(std::string_view s) { return le<std::uint64_t>(s.size()) + std::string(s); }

// gguf_metadata_value_type
enum : std::uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kStr, kArr, kU64, kI64, kF64 };
// ggml_type
enum : std::uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ4_0 = 2, kTypeQ8_0 = 8, kTypeQ6_K = 14, kTypeI32 = 26 };

std::uint64_t pad_to(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

class GgufBuilder {
 public:
  explicit GgufBuilder(std::uint32_t version = 3) : version_(version) {}

  // A key/value pair with its value bytes as given.
  GgufBuilder& kv(std::string_view key, std::uint32_t type, const std::string& value) {
    kvs_.push_back(gstr(key) + le(type) + value);
    return *this;
  }
  GgufBuilder& u8(std::string_view k, std::uint8_t v) { return kv(k, kU8, le(v)); }
  GgufBuilder& i8(std::string_view k, std::int8_t v) { return kv(k, kI8, le(v)); }
  GgufBuilder& u16(std::string_view k, std::uint16_t v) { return kv(k, kU16, le(v)); }
  GgufBuilder& i16(std::string_view k, std::int16_t v) { return kv(k, kI16, le(v)); }
  GgufBuilder& u32(std::string_view k, std::uint32_t v) { return kv(k, kU32, le(v)); }
  GgufBuilder& i32(std::string_view k, std::int32_t v) { return kv(k, kI32, le(v)); }
  GgufBuilder& f32(std::string_view k, float v) { return kv(k, kF32, le(v)); }
  GgufBuilder& boolean(std::string_view k, bool v) { return kv(k, kBool, le<std::uint8_t>(v ? 1 : 0)); }
  GgufBuilder& str(std::string_view k, std::string_view v) { return kv(k, kStr, gstr(v)); }
  GgufBuilder& u64(std::string_view k, std::uint64_t v) { return kv(k, kU64, le(v)); }
  GgufBuilder& i64(std::string_view k, std::int64_t v) { return kv(k, kI64, le(v)); }
  GgufBuilder& f64(std::string_view k, double v) { return kv(k, kF64, le(v)); }
  // An array: element type, count, then the elements as given.
  GgufBuilder& array(std::string_view k, std::uint32_t element_type, std::uint64_t count, const std::string& elements) {
    return kv(k, kArr, le(element_type) + le(count) + elements);
  }
  template <typename T>
  GgufBuilder& nums(std::string_view k, std::uint32_t element_type, const std::vector<T>& v) {
    std::string e;
    for (const T& x : v) e += le(x);
    return array(k, element_type, v.size(), e);
  }
  GgufBuilder& strs(std::string_view k, const std::vector<std::string>& v) {
    std::string e;
    for (const std::string& s : v) e += gstr(s);
    return array(k, kStr, v.size(), e);
  }
  // general.alignment (uint32) and the layout that follows it.
  GgufBuilder& alignment(std::uint32_t a) {
    align_ = a;
    return u32("general.alignment", a);
  }
  // A tensor: ne innermost first; data placed at `offset` (default: after the
  // previous tensor, padded to the alignment).
  GgufBuilder& tensor(std::string_view name, std::vector<std::uint64_t> ne, std::uint32_t type, std::string data,
                      std::optional<std::uint64_t> offset = std::nullopt) {
    tensors_.push_back({std::string(name), std::move(ne), type, std::move(data), offset});
    return *this;
  }

  std::optional<std::uint64_t> tensor_count, kv_count;  // override the counts in the header
  std::string magic = "GGUF";

  std::string bytes() const {
    std::string out = magic + le(version_) + le(tensor_count.value_or(tensors_.size())) +
                      le(kv_count.value_or(kvs_.size()));
    for (const std::string& kv : kvs_) out += kv;
    std::vector<std::uint64_t> offsets;
    std::uint64_t next = 0, end = 0;
    for (const Tensor& t : tensors_) {
      const std::uint64_t off = t.offset.value_or(pad_to(next, align_));
      offsets.push_back(off);
      next = off + t.data.size();
      if (off < kFar) end = std::max(end, next);  // data at an absurd offset is not written
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      out += gstr(t.name) + le<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
      for (const std::uint64_t d : t.ne) out += le(d);
      out += le(t.type) + le(offsets[i]);
    }
    if (tensors_.empty()) return out;
    out.resize(pad_to(out.size(), align_), '\0');
    const std::size_t data_start = out.size();
    out.resize(data_start + end, '\0');
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (offsets[i] < kFar)
        std::memcpy(out.data() + data_start + offsets[i], tensors_[i].data.data(), tensors_[i].data.size());
    return out;
  }
  void write(const std::string& path) const { test::write_file(path, bytes()); }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;
    std::uint32_t type;
    std::string data;
    std::optional<std::uint64_t> offset;
  };
  static constexpr std::uint64_t kFar = 1 << 24;
  std::uint32_t version_;
  std::uint64_t align_ = 32;  // GGUF_DEFAULT_ALIGNMENT
  std::vector<std::string> kvs_;
  std::vector<Tensor> tensors_;
};

// ------------------------------------------------------------------ tensor data

std::string f32_bytes(const std::vector<float>& v) {
  std::string s;
  for (const float x : v) s += le(x);
  return s;
}

// IEEE half of a float that half represents exactly (normal numbers and zero only).
std::uint16_t half_bits(float x) {
  if (x == 0) return std::signbit(x) ? 0x8000 : 0;
  const auto u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = u >> 31, exp = (u >> 23) & 0xff, mant = u & 0x7fffff;
  const int e = static_cast<int>(exp) - 127 + 15;
  EXPECT_TRUE(e > 0 && e < 31 && (mant & 0x1fff) == 0) << x << " is not exact in half precision";
  return static_cast<std::uint16_t>((sign << 15) | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13));
}

// A Q4_0 block (ggml block_q4_0: half d, 16 bytes; element i in the low nibble of
// byte i, element i + 16 in the high nibble, both offset by 8): values q[i] * d.
std::string q4_0_block(float d, const std::vector<int>& q) {
  std::string s = le(half_bits(d));
  for (int i = 0; i < 16; ++i) s += static_cast<char>((q[i] + 8) | ((q[i + 16] + 8) << 4));
  return s;
}
// A Q8_0 block (half d, 32 int8): values q[i] * d.
std::string q8_0_block(float d, const std::vector<int>& q) {
  std::string s = le(half_bits(d));
  for (int i = 0; i < 32; ++i) s += static_cast<char>(static_cast<std::int8_t>(q[i]));
  return s;
}
// A Q6_K block (block_q6_K: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16],
// half d) of 256 values d * scales[e / 16] * q[e], q in [-32, 31]. Within each half
// of 128 elements, element 32 * g + l (g < 4, l < 32) has its low bits in ql[l + 32 *
// (g % 2)] (low nibble for g < 2, high for g >= 2) and its high bits at bit 2g of qh[l].
std::string q6_K_block(float d, const std::vector<int>& scales, const std::vector<int>& q) {
  std::uint8_t ql[128] = {}, qh[64] = {};
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, g = (e % 128) / 32, l = e % 32;
    const int u = q[e] + 32;
    std::uint8_t& low = ql[n * 64 + l + 32 * (g % 2)];
    low |= static_cast<std::uint8_t>((u & 0xf) << (g >= 2 ? 4 : 0));
    qh[n * 32 + l] |= static_cast<std::uint8_t>((u >> 4) << (2 * g));
  }
  std::string s(reinterpret_cast<const char*>(ql), 128);
  s.append(reinterpret_cast<const char*>(qh), 64);
  for (int i = 0; i < 16; ++i) s += static_cast<char>(static_cast<std::int8_t>(scales[i]));
  return s + le(half_bits(d));
}

std::vector<float> read_f32(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  tensor_to_f32(t, out.data());
  return out;
}
std::string bytes_of(std::span<const std::uint8_t> s) { return {reinterpret_cast<const char*>(s.data()), s.size()}; }

// ------------------------------------------------------------------ a tiny model

// Deterministic small values, exact in float and half.
std::vector<float> pattern(std::size_t n, int seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 7 + seed * 13) % 17) - 8) / 16.0f;
  return v;
}

// A tiny Llama-family model in Hugging Face order: hidden 8, 2 heads of 4 (1 KV
// head), ffn 12, one layer, 6 tokens. `weights` by HF name: (HF shape, values).
struct TinyModel {
  std::string arch = "llama";  // GGUF general.architecture
  std::int64_t hidden = 8, ffn = 12, heads = 2, kv_heads = 1, head_dim = 4, vocab = 6, layers = 1;
  bool tied = false;
  bool qkv_bias = false;  // q/k/v biases (qwen2 always has them)
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>> weights;

  TinyModel() = default;
  explicit TinyModel(std::string a) : arch(std::move(a)) { qkv_bias = arch == "qwen2"; }

  void make() {
    weights.clear();
    int seed = 0;
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
      std::size_t n = 1;
      for (auto d : shape) n *= static_cast<std::size_t>(d);
      weights[name] = {shape, pattern(n, ++seed)};
    };
    add("model.embed_tokens.weight", {vocab, hidden});
    add("model.norm.weight", {hidden});
    if (!tied) add("lm_head.weight", {vocab, hidden});
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      add(p + "input_layernorm.weight", {hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden});
      add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden});
      add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden});
      add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim});
      if (qkv_bias) {
        add(p + "self_attn.q_proj.bias", {heads * head_dim});
        add(p + "self_attn.k_proj.bias", {kv_heads * head_dim});
        add(p + "self_attn.v_proj.bias", {kv_heads * head_dim});
      }
      if (arch == "qwen3") {
        add(p + "self_attn.q_norm.weight", {head_dim});
        add(p + "self_attn.k_norm.weight", {head_dim});
      }
      add(p + "mlp.gate_proj.weight", {ffn, hidden});
      add(p + "mlp.up_proj.weight", {ffn, hidden});
      add(p + "mlp.down_proj.weight", {hidden, ffn});
    }
  }

  // Metadata as convert_hf_to_gguf.py writes it.
  GgufBuilder metadata() const {
    GgufBuilder g;
    g.str("general.architecture", arch).str("general.name", "tiny");
    const std::string a = arch + ".";
    g.u32(a + "context_length", 64).u32(a + "embedding_length", static_cast<std::uint32_t>(hidden));
    g.u32(a + "feed_forward_length", static_cast<std::uint32_t>(ffn)).u32(a + "block_count", static_cast<std::uint32_t>(layers));
    g.u32(a + "attention.head_count", static_cast<std::uint32_t>(heads));
    g.u32(a + "attention.head_count_kv", static_cast<std::uint32_t>(kv_heads));
    g.f32(a + "rope.freq_base", 500000.0f).f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
    g.u32(a + "rope.dimension_count", static_cast<std::uint32_t>(head_dim));
    if (head_dim != hidden / heads) g.u32(a + "attention.key_length", static_cast<std::uint32_t>(head_dim));
    g.str("tokenizer.ggml.model", "gpt2");
    std::vector<std::string> tokens;
    for (std::int64_t i = 0; i < vocab; ++i) tokens.push_back(fmt::format("t{}", i));
    g.strs("tokenizer.ggml.tokens", tokens);
    g.u32("tokenizer.ggml.bos_token_id", 1).u32("tokenizer.ggml.eos_token_id", 2);
    return g;
  }

  // llama.cpp's permutation of q/k rows (convert_hf_to_gguf.py LlamaModel.permute:
  // reshape(n_head, 2, rows / n_head / 2, K).swapaxes(1, 2)), written out: GGUF row
  // (h, i, j) = h * hd + 2 * i + j is HF row (h, j, i) = h * hd + j * hd / 2 + i.
  static std::vector<float> permute(const std::vector<float>& w, std::int64_t rows, std::int64_t k, std::int64_t n_head) {
    std::vector<float> out(w.size());
    const std::int64_t hd = rows / n_head, half = hd / 2;
    for (std::int64_t h = 0; h < n_head; ++h)
      for (std::int64_t i = 0; i < half; ++i)
        for (std::int64_t j = 0; j < 2; ++j)
          for (std::int64_t c = 0; c < k; ++c)
            out[static_cast<std::size_t>((h * hd + 2 * i + j) * k + c)] =
                w[static_cast<std::size_t>((h * hd + j * half + i) * k + c)];
    return out;
  }

  // The tensors, F32, under their GGUF names, q/k permuted for llama.
  void add_tensors(GgufBuilder& g) const {
    for (const auto& [name, tw] : weights) {
      const auto& [shape, values] = tw;
      const std::optional<std::string> gname = gguf_tensor_name(name);
      EXPECT_TRUE(gname.has_value()) << name;
      std::vector<float> v = values;
      const bool q = name.find("q_proj.") != std::string::npos, k = name.find("k_proj.") != std::string::npos;
      if (arch == "llama" && (q || k))
        v = permute(v, shape[0], shape.size() > 1 ? shape[1] : 1, q ? heads : kv_heads);
      g.tensor(*gname, {shape.rbegin(), shape.rend()}, kTypeF32, f32_bytes(v));
    }
  }
  GgufBuilder gguf() const {
    GgufBuilder g = metadata();
    add_tensors(g);
    return g;
  }
};

class GgufTest : public ::testing::Test {
 protected:
  test::TempDir dir_;
  std::string path(const std::string& name = "model.gguf") const { return dir_.file(name); }
  std::string write(const GgufBuilder& g, const std::string& name = "model.gguf") const {
    g.write(path(name));
    return path(name);
  }
  std::string write(const std::string& bytes, const std::string& name = "model.gguf") const {
    test::write_file(path(name), bytes);
    return path(name);
  }
};

// ------------------------------------------------------------------ metadata

TEST_F(GgufTest, EveryScalarTypeReadsBack) {
  GgufBuilder g;
  g.u8("a.u8", 250).i8("a.i8", -120).u16("a.u16", 65000).i16("a.i16", -32000).u32("a.u32", 4000000000u);
  g.i32("a.i32", -2000000000).f32("a.f32", 0.15625f).boolean("a.true", true).boolean("a.false", false);
  g.str("a.str", "h\xc3\xa9llo").str("a.empty", "").u64("a.u64", 1ull << 62).u64("a.u64big", 0xfffffffffffffff0ull);
  g.i64("a.i64", -(1ll << 60)).f64("a.f64", 1e300);
  const GgufFile f(write(g));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 15u);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_int("a.u8"), 250);
  EXPECT_EQ(f.get_int("a.i8"), -120);
  EXPECT_EQ(f.get_int("a.u16"), 65000);
  EXPECT_EQ(f.get_int("a.i16"), -32000);
  EXPECT_EQ(f.get_int("a.u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("a.i32"), -2000000000);
  EXPECT_EQ(f.get_int("a.u64"), 1ll << 62);
  EXPECT_EQ(f.get_int("a.i64"), -(1ll << 60));
  EXPECT_EQ(f.get_float("a.f32"), 0.15625);
  EXPECT_EQ(f.get_float("a.f64"), 1e300);
  EXPECT_EQ(f.get_float("a.i16"), -32000.0);  // integers read as numbers too
  EXPECT_EQ(f.get_bool("a.true"), true);
  EXPECT_EQ(f.get_bool("a.false"), false);
  EXPECT_EQ(f.get_string("a.str"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_string("a.empty"), "");
  EXPECT_EQ(f.find("a.u32")->type, GgufValueType::kUint32);
  EXPECT_EQ(f.find("a.f64")->type, GgufValueType::kFloat64);
  // uint64 beyond int64: kept unsigned, refused by get_int.
  EXPECT_EQ(f.find("a.u64big")->u, 0xfffffffffffffff0ull);
  EXPECT_MENTIONS(f.get_int("a.u64big"), "'a.u64big'", "out of range");
  // Absent keys.
  EXPECT_EQ(f.get_int("nope"), std::nullopt);
  EXPECT_EQ(f.get_float("nope"), std::nullopt);
  EXPECT_EQ(f.get_bool("nope"), std::nullopt);
  EXPECT_EQ(f.get_string("nope"), std::nullopt);
  EXPECT_EQ(f.get_strings("nope"), nullptr);
  EXPECT_EQ(f.find("nope"), nullptr);
  // Wrong types name the key.
  EXPECT_MENTIONS(f.get_int("a.f32"), "'a.f32'", "float32", "integer");
  EXPECT_MENTIONS(f.get_int("a.str"), "'a.str'", "string");
  EXPECT_MENTIONS(f.get_int("a.true"), "'a.true'", "bool");
  EXPECT_MENTIONS(f.get_float("a.str"), "'a.str'", "number");
  EXPECT_MENTIONS(f.get_float("a.true"), "'a.true'");
  EXPECT_MENTIONS(f.get_bool("a.u8"), "'a.u8'", "bool");
  EXPECT_MENTIONS(f.get_string("a.i32"), "'a.i32'", "string");
  EXPECT_MENTIONS(f.get_strings("a.str"), "'a.str'", "array of strings");
  EXPECT_MENTIONS(f.get_floats("a.f32"), "'a.f32'");
  EXPECT_MENTIONS(f.get_ints("a.i32"), "'a.i32'");
}

// A model's loading reads one GGUF several times (config, tokenizer, chat template, weights): shared_gguf parses it
// once while a result is held, and again when it is let go or the file changes.
TEST_F(GgufTest, SharedGgufIsParsedOnceWhileHeldAndAgainWhenTheFileChanges) {
  const std::string file = write(GgufBuilder().str("general.name", "first"));
  auto first = shared_gguf(file);
  EXPECT_EQ(shared_gguf(file).get(), first.get());  // held: the same parse
  EXPECT_EQ(first.use_count(), 1);                   // the cache holds none itself
  // Replaced under the same name, as a download or woq quantize does (a new file renamed over the old).
  std::filesystem::rename(write(GgufBuilder().str("general.name", "second, longer"), "new.gguf"), file);
  auto second = shared_gguf(file);
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(second->front().get_string("general.name"), "second, longer");
  EXPECT_EQ(first->front().get_string("general.name"), "first");  // the old mapping stays valid for its holders
  const std::weak_ptr<const std::vector<GgufFile>> released = second;
  second.reset();
  EXPECT_TRUE(released.expired());  // let go: nothing keeps the file mapped
  EXPECT_EQ(shared_gguf(file)->front().get_string("general.name"), "second, longer");
}

TEST_F(GgufTest, ArraysReadBack) {
  GgufBuilder g;
  g.strs("s", {"a", "", "\xe4\xb8\xad", std::string("nul\0inside", 10)});
  g.strs("s.empty", {});
  g.nums<std::uint8_t>("u8", kU8, {0, 255});
  g.nums<std::int8_t>("i8", kI8, {-128, 127});
  g.nums<std::uint16_t>("u16", kU16, {65535});
  g.nums<std::int16_t>("i16", kI16, {-32768, 5});
  g.nums<std::uint32_t>("u32", kU32, {4294967295u, 0});
  g.nums<std::int32_t>("i32", kI32, {-7, 8, 9});
  g.nums<std::uint64_t>("u64", kU64, {1ull << 63 >> 1});
  g.nums<std::uint64_t>("u64.big", kU64, {1, 1ull << 63});
  g.nums<std::int64_t>("i64", kI64, {-(1ll << 62)});
  g.nums<float>("f32", kF32, {0.5f, -1.25f});
  g.nums<double>("f64", kF64, {1.5, -0.25});
  g.nums<std::uint8_t>("bool", kBool, {1, 0, 1});
  g.nums<std::int32_t>("i32.empty", kI32, {});
  const GgufFile f(write(g));
  const auto* s = f.get_strings("s");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[0], "a");
  EXPECT_EQ((*s)[1], "");
  EXPECT_EQ((*s)[2], "\xe4\xb8\xad");
  EXPECT_EQ((*s)[3], std::string_view("nul\0inside", 10));
  EXPECT_TRUE(f.get_strings("s.empty")->empty());
  using I = std::vector<std::int64_t>;
  EXPECT_EQ(f.get_ints("u8"), (I{0, 255}));
  EXPECT_EQ(f.get_ints("i8"), (I{-128, 127}));
  EXPECT_EQ(f.get_ints("u16"), (I{65535}));
  EXPECT_EQ(f.get_ints("i16"), (I{-32768, 5}));
  EXPECT_EQ(f.get_ints("u32"), (I{4294967295ll, 0}));
  EXPECT_EQ(f.get_ints("i32"), (I{-7, 8, 9}));
  EXPECT_EQ(f.get_ints("u64"), (I{1ll << 62}));
  EXPECT_EQ(f.get_ints("i64"), (I{-(1ll << 62)}));
  EXPECT_EQ(f.get_ints("i32.empty"), I{});
  EXPECT_MENTIONS(f.get_ints("u64.big"), "'u64.big'[1]", "out of range");
  EXPECT_EQ(f.get_floats("f32"), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(f.get_floats("f64"), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(f.find("bool")->count, 3u);
  EXPECT_EQ(f.find("bool")->element_type, GgufValueType::kBool);
  EXPECT_EQ(f.find("s")->element_type, GgufValueType::kString);
  EXPECT_MENTIONS(f.get_strings("i32"), "'i32'", "array of int32");
  EXPECT_MENTIONS(f.get_ints("f32"), "'f32'", "array of float32");
  EXPECT_MENTIONS(f.get_floats("s"), "'s'", "array of string");
  EXPECT_MENTIONS(f.get_ints("s"), "'s'");
  EXPECT_MENTIONS(f.get_int("i32"), "'i32'", "array");
  EXPECT_MENTIONS(f.get_string("s"), "'s'", "array");
}

// ------------------------------------------------------------------ versions, alignment, tensors

TEST_F(GgufTest, Version2And3) {
  for (const std::uint32_t v : {2u, 3u}) {
    GgufBuilder g(v);
    g.str("general.architecture", "llama").tensor("w", {4}, kTypeF32, f32_bytes({1, 2, 3, 4}));
    const GgufFile f(write(g));
    EXPECT_EQ(f.version(), v);
    ASSERT_EQ(f.tensors().size(), 1u);
    EXPECT_EQ(bytes_of(f.tensors()[0].bytes), f32_bytes({1, 2, 3, 4}));
  }
}

// Tensors of each type, their data at offsets padded to the alignment.
TEST_F(GgufTest, TensorViewsAtAlignedOffsets) {
  std::vector<int> q32(32), q256(256), sc(16);
  for (int i = 0; i < 32; ++i) q32[i] = i % 16 - 8;
  for (int i = 0; i < 256; ++i) q256[i] = (i * 5) % 64 - 32;
  for (int i = 0; i < 16; ++i) sc[i] = i - 8;
  const std::string f32 = f32_bytes({1.5f, -2, 0.25f});  // 12 bytes: the next tensor needs padding
  const std::string f16 = le(half_bits(1)) + le(half_bits(-0.5f)) + le(half_bits(3)) + le(half_bits(0)) +
                          le(half_bits(65504)) + le(half_bits(-2));
  const std::string q4 = q4_0_block(0.5f, q32) + q4_0_block(-2, q32);
  const std::string q8 = q8_0_block(0.25f, q32);
  const std::string q6 = q6_K_block(0.125f, sc, q256);
  for (const std::uint32_t align : {32u, 64u, 1u, 8u, 4096u}) {
    SCOPED_TRACE(align);
    GgufBuilder g;
    if (align != 32) g.alignment(align);
    g.tensor("a.f32", {3}, kTypeF32, f32).tensor("b.f16", {3, 2}, kTypeF16, f16);
    g.tensor("c.q4_0", {32, 2}, kTypeQ4_0, q4).tensor("d.q8_0", {32, 1, 1, 1}, kTypeQ8_0, q8);
    g.tensor("e.q6_K", {256}, kTypeQ6_K, q6);
    const std::string bytes = g.bytes();
    const GgufFile f(write(bytes));
    EXPECT_EQ(f.alignment(), align);
    ASSERT_EQ(f.tensors().size(), 5u);
    const std::vector<std::string> data{f32, f16, q4, q8, q6};
    const std::vector<std::string> types{"f32", "f16", "q4_0", "q8_0", "q6_K"};
    std::uint64_t expect_offset = 0;
    const auto base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    const std::uint8_t* mapped = f.tensors()[0].bytes.data();
    const std::size_t data_start = bytes.size() - (pad_to(f32.size(), align) + pad_to(f16.size(), align) +
                                                   pad_to(q4.size(), align) + pad_to(q8.size(), align) + q6.size());
    EXPECT_EQ(data_start % align, 0u);
    for (std::size_t i = 0; i < 5; ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.type->name, types[i]);
      EXPECT_EQ(t.offset, expect_offset) << t.name;
      EXPECT_EQ(t.offset % align, 0u);
      EXPECT_EQ(bytes_of(t.bytes), data[i]) << t.name;
      // At data_start + offset in the file.
      EXPECT_EQ(static_cast<std::size_t>(t.bytes.data() - mapped), expect_offset);
      EXPECT_EQ(std::memcmp(base + data_start + t.offset, data[i].data(), data[i].size()), 0);
      EXPECT_EQ(f.find_tensor(t.name), &t);
      expect_offset = pad_to(expect_offset + data[i].size(), align);
    }
    EXPECT_EQ(f.tensors()[1].ne, (std::vector<std::int64_t>{3, 2}));
    EXPECT_EQ(f.tensors()[3].ne, (std::vector<std::int64_t>{32, 1, 1, 1}));
    EXPECT_EQ(f.tensors()[2].numel(), 64);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
  }
}

// ------------------------------------------------------------------ the tensor source

// Names mapped to Hugging Face's, shapes reversed, types, values decoded.
TEST_F(GgufTest, TensorSourceNamesShapesAndValues) {
  std::vector<int> q32(32), q256(256), sc(16);
  for (int i = 0; i < 32; ++i) q32[i] = (i * 3) % 16 - 8;
  for (int i = 0; i < 256; ++i) q256[i] = (i * 7) % 64 - 32;
  for (int i = 0; i < 16; ++i) sc[i] = 2 * i - 15;
  TinyModel m;
  GgufBuilder g = m.metadata();
  g.tensor("token_embd.weight", {8, 6}, kTypeF32, f32_bytes(pattern(48, 1)));
  g.tensor("output_norm.weight", {8}, kTypeF16, std::string(16, '\0'));
  // [2 rows, 32] Q4_0, [3, 32] Q8_0, [1, 256] Q6_K.
  g.tensor("blk.0.ffn_up.weight", {32, 2}, kTypeQ4_0, q4_0_block(0.5f, q32) + q4_0_block(0.25f, q32));
  std::string q8;
  for (int r = 0; r < 3; ++r) q8 += q8_0_block(static_cast<float>(r + 1), q32);
  g.tensor("blk.0.ffn_gate.weight", {32, 3}, kTypeQ8_0, q8);
  g.tensor("blk.0.ffn_down.weight", {256, 1}, kTypeQ6_K, q6_K_block(0.5f, sc, q256));
  g.tensor("blk.0.attn_v.weight", {8, 4}, kTypeI32, std::string(128, '\0'));
  const std::string p = write(g);
  const TensorStore store = TensorStore::open(p);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
                                                     "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                                     "model.layers.0.self_attn.v_proj.weight", "model.norm.weight"}));
  const TensorView& embed = store.get("model.embed_tokens.weight");
  EXPECT_EQ(embed.name, "token_embd.weight");  // messages keep the GGUF name
  EXPECT_EQ(embed.file, p);
  EXPECT_EQ(embed.shape, (std::vector<std::int64_t>{6, 8}));
  EXPECT_EQ(embed.dtype, DType::kF32);
  EXPECT_EQ(read_f32(embed), pattern(48, 1));
  EXPECT_EQ(store.get("model.norm.weight").dtype, DType::kF16);
  EXPECT_EQ(store.get("model.norm.weight").shape, (std::vector<std::int64_t>{8}));

  const TensorView& up = store.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.dtype, DType::kGgml);
  EXPECT_EQ(up.type_name(), "q4_0");
  EXPECT_EQ(up.shape, (std::vector<std::int64_t>{2, 32}));
  std::vector<float> expect;
  for (const float d : {0.5f, 0.25f})
    for (int i = 0; i < 32; ++i) expect.push_back(d * static_cast<float>(q32[i]));
  EXPECT_EQ(read_f32(up), expect);

  const TensorView& gate = store.get("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.shape, (std::vector<std::int64_t>{3, 32}));
  expect.clear();
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 32; ++i) expect.push_back(static_cast<float>(r + 1) * static_cast<float>(q32[i]));
  EXPECT_EQ(read_f32(gate), expect);
  std::vector<float> row(32);
  tensor_to_f32(gate, row.data(), 64, 32);  // one row
  EXPECT_EQ(row, std::vector<float>(expect.begin() + 64, expect.end()));

  const TensorView& down = store.get("model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down.type_name(), "q6_K");
  EXPECT_EQ(down.shape, (std::vector<std::int64_t>{1, 256}));
  expect.clear();
  for (int e = 0; e < 256; ++e) expect.push_back(0.5f * static_cast<float>(sc[e / 16]) * static_cast<float>(q256[e]));
  EXPECT_EQ(read_f32(down), expect);

  // A type woq cannot decode: a clear error naming the tensor.
  const TensorView& v = store.get("model.layers.0.self_attn.v_proj.weight");
  EXPECT_MENTIONS(read_f32(v), "blk.0.attn_v.weight", "i32");
}

TEST_F(GgufTest, TensorNameTable) {
  EXPECT_EQ(hf_tensor_name("blk.3.attn_q.weight"), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(hf_tensor_name("blk.12.ffn_down.weight"), "model.layers.12.mlp.down_proj.weight");
  EXPECT_EQ(hf_tensor_name("blk.0.attn_k_norm.weight"), "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(hf_tensor_name("blk.0.attn_output.bias"), "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(hf_tensor_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_tensor_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(hf_tensor_name("rope_freqs.weight"), std::nullopt);
  EXPECT_EQ(hf_tensor_name("blk.x.attn_q.weight"), std::nullopt);
  EXPECT_EQ(hf_tensor_name("blk..attn_q.weight"), std::nullopt);
  EXPECT_EQ(hf_tensor_name("blk.0.attn_q"), std::nullopt);
  EXPECT_EQ(hf_tensor_name("blk.0"), std::nullopt);
  EXPECT_EQ(gguf_tensor_name("model.layers.7.mlp.gate_proj.weight"), "blk.7.ffn_gate.weight");
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq"), std::nullopt);
  TinyModel m("qwen3");
  m.qkv_bias = true;
  m.make();
  for (const auto& [hf, w] : m.weights) {
    const auto g = gguf_tensor_name(hf);
    ASSERT_TRUE(g.has_value()) << hf;
    EXPECT_EQ(hf_tensor_name(*g), hf);
  }
}

// llama.cpp stores llama q/k rows permuted; read back they are in Hugging Face's order.
TEST_F(GgufTest, LlamaQkPermutationUndone) {
  TinyModel m;
  m.heads = 4, m.kv_heads = 2, m.head_dim = 6, m.hidden = 24;
  m.qkv_bias = true;  // llama with attention_bias: the biases are permuted too
  m.make();
  const TensorStore store = TensorStore::open(write(m.gguf()));
  for (const auto& [name, w] : m.weights) {
    const TensorView& t = store.get(name);
    EXPECT_EQ(t.shape, w.first) << name;
    EXPECT_EQ(read_f32(t), w.second) << name;
  }
  const TensorView& q = store.get("model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(q.row_order);
  // Rows one at a time too.
  const std::vector<float>& hf_q = m.weights.at("model.layers.0.self_attn.q_proj.weight").second;
  std::vector<float> row(24);
  for (std::int64_t r = 0; r < 24; ++r) {
    tensor_to_f32(q, row.data(), r * 24, 24);
    EXPECT_EQ(row, std::vector<float>(hf_q.begin() + r * 24, hf_q.begin() + (r + 1) * 24)) << r;
  }
  // The order itself: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i.
  const auto order = gguf_qk_row_order(24, 4);
  EXPECT_EQ(order[1], 2);  // HF row 1 (h 0, j 0, i 1) is GGUF row 2
  EXPECT_EQ(order[3], 1);  // HF row 3 (h 0, j 1, i 0) is GGUF row 1
  EXPECT_EQ(order[6 + 5], 6 + 5);
  EXPECT_MENTIONS(gguf_qk_row_order(10, 4), "10 rows", "4 heads");
  EXPECT_MENTIONS(gguf_qk_row_order(12, 4), "12 rows");  // odd head size
}

// qwen2 and qwen3 are not permuted by llama.cpp: read as stored.
TEST_F(GgufTest, QwenNotPermuted) {
  for (const char* arch : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    TinyModel m(arch);
    m.make();
    const TensorStore store = TensorStore::open(write(m.gguf(), std::string(arch) + ".gguf"));
    for (const auto& [name, w] : m.weights) {
      EXPECT_FALSE(store.get(name).row_order) << name;
      EXPECT_EQ(read_f32(store.get(name)), w.second) << name;
    }
  }
}

// ------------------------------------------------------------------ split sets

TEST_F(GgufTest, SplitSetMerged) {
  TinyModel m;
  m.make();
  GgufBuilder all = m.gguf();
  // Part 1: the metadata and the embeddings; part 2 the rest (as gguf-split writes them).
  GgufBuilder p1 = m.metadata(), p2;
  p1.u16("split.no", 0).u16("split.count", 2).i32("split.tensors.count", static_cast<std::int32_t>(m.weights.size()));
  p2.u16("split.no", 1).u16("split.count", 2).i32("split.tensors.count", static_cast<std::int32_t>(m.weights.size()));
  for (const auto& [name, w] : m.weights) {
    std::vector<float> v = w.second;
    if (name.find("q_proj") != std::string::npos) v = TinyModel::permute(v, w.first[0], w.first[1], m.heads);
    if (name.find("k_proj") != std::string::npos) v = TinyModel::permute(v, w.first[0], w.first[1], m.kv_heads);
    (name == "model.embed_tokens.weight" ? p1 : p2)
        .tensor(*gguf_tensor_name(name), {w.first.rbegin(), w.first.rend()}, kTypeF32, f32_bytes(v));
  }
  write(p1, "tiny-00001-of-00002.gguf");
  write(p2, "tiny-00002-of-00002.gguf");
  EXPECT_EQ(gguf_split_paths(path("tiny-00002-of-00002.gguf")),
            (std::vector<std::string>{path("tiny-00001-of-00002.gguf"), path("tiny-00002-of-00002.gguf")}));
  EXPECT_EQ(gguf_split_paths(path("model.gguf")), std::vector<std::string>{path("model.gguf")});
  const auto parts = open_gguf(path("tiny-00001-of-00002.gguf"));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].tensors().size(), 1u);
  const TensorStore store = TensorStore::open(path("tiny-00001-of-00002.gguf"));
  EXPECT_EQ(store.names().size(), m.weights.size());
  for (const auto& [name, w] : m.weights) EXPECT_EQ(read_f32(store.get(name)), w.second) << name;
  EXPECT_EQ(store.get("model.norm.weight").file, path("tiny-00002-of-00002.gguf"));
  const ModelConfig c = read_model_config(path("tiny-00001-of-00002.gguf"));
  EXPECT_EQ(c.vocab_size, 6);
  EXPECT_FALSE(c.tie_word_embeddings);  // output.weight is in part 2
  // woq quantize -o one of the other parts would replace it: refused, the part untouched.
  {
    ThreadPool pool(1);
    QuantizeOptions q;
    q.spec = {LowBit::kSymInt8, 32, Int4Range::kFull};
    q.force = true;
    EXPECT_MENTIONS(quantize_checkpoint(path("tiny-00001-of-00002.gguf"), path("tiny-00002-of-00002.gguf"), q, pool),
                    "the output would replace", "tiny-00002-of-00002.gguf, a part of the input");
    EXPECT_TRUE(std::filesystem::is_regular_file(path("tiny-00002-of-00002.gguf")));
  }

  // A part missing.
  std::filesystem::remove(path("tiny-00002-of-00002.gguf"));
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "split part 2 of 2 is missing",
                  "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(TensorStore::open(path("tiny-00001-of-00002.gguf")), "missing");
  // split.no wrong (part 2 says it is part 1).
  GgufBuilder bad = p2;
  bad.u16("split.no", 0);  // duplicate key: refused before the split check
  write(bad, "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "duplicate metadata key 'split.no'");
  GgufBuilder wrong_no;
  wrong_no.u16("split.no", 0).u16("split.count", 2).tensor("output.weight", {8, 6}, kTypeF32, f32_bytes(pattern(48, 3)));
  write(wrong_no, "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "tiny-00002-of-00002.gguf", "split.no", "expected 1 / 2");
  GgufBuilder no_keys;
  no_keys.tensor("output.weight", {8, 6}, kTypeF32, f32_bytes(pattern(48, 3)));
  write(no_keys, "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "split.no", "absent");
  GgufBuilder wrong_count;
  wrong_count.u16("split.no", 1).u16("split.count", 3).tensor("output.weight", {8, 6}, kTypeF32, f32_bytes(pattern(48, 3)));
  write(wrong_count, "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "split.count", "1 / 3");
  // A tensor in both parts.
  GgufBuilder twice;
  twice.u16("split.no", 1).u16("split.count", 2).tensor("token_embd.weight", {8, 6}, kTypeF32, f32_bytes(pattern(48, 3)));
  write(twice, "tiny-00002-of-00002.gguf");
  EXPECT_MENTIONS(open_gguf(path("tiny-00001-of-00002.gguf")), "'token_embd.weight' is also in", "tiny-00001-of-00002.gguf");
  // Names that are not a split set's.
  EXPECT_MENTIONS(gguf_split_paths(path("x-00003-of-00002.gguf")), "not a valid gguf-split name");
  EXPECT_MENTIONS(gguf_split_paths(path("x-00000-of-00002.gguf")), "not a valid gguf-split name");
}

// ------------------------------------------------------------------ the model config

TEST_F(GgufTest, ModelConfigFromMetadata) {
  TinyModel m;
  m.make();
  GgufBuilder g = m.gguf();
  g.u32("tokenizer.ggml.eot_token_id", 5).u32("tokenizer.ggml.eom_token_id", 2);  // 2 again: listed once
  const std::string p = write(g);
  const ModelConfig c = read_model_config(p);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 8);
  EXPECT_EQ(c.intermediate_size, 12);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 6);
  EXPECT_EQ(c.max_position_embeddings, 64);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-5f);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{2, 5}));

  // Tied embeddings when output.weight is absent; key_length other than hidden / heads;
  // head_count_kv absent = head_count; the rope_freqs tensor (llama3 scaling).
  TinyModel t;
  t.tied = true;
  t.head_dim = 6;
  t.make();
  GgufBuilder tg = t.metadata();
  t.add_tensors(tg);
  tg.tensor("rope_freqs.weight", {3}, kTypeF32, f32_bytes({1, 2.5f, 8}));
  const ModelConfig tc = read_model_config(write(tg, "tied.gguf"));
  EXPECT_TRUE(tc.tie_word_embeddings);
  EXPECT_EQ(tc.head_dim, 6);
  EXPECT_EQ(tc.q_dim(), 12);
  EXPECT_EQ(tc.rope_scaling.type, RopeScaling::Type::kFactors);
  EXPECT_EQ(tc.rope_scaling.freq_factors, (std::vector<float>{1, 2.5f, 8}));
  // The tensor source leaves rope_freqs out.
  const TensorStore ts = TensorStore::open(path("tied.gguf"));
  EXPECT_EQ(ts.find("rope_freqs.weight"), nullptr);
  EXPECT_EQ(ts.find("lm_head.weight"), nullptr);
  EXPECT_EQ(ts.names().size(), t.weights.size());

  // Defaults, rope.scaling linear, vocab from token_embd when there are no tokens, qwen2 / qwen3.
  GgufBuilder d;
  d.str("general.architecture", "qwen2").u32("qwen2.embedding_length", 8).u32("qwen2.feed_forward_length", 4);
  d.u32("qwen2.block_count", 2).u32("qwen2.attention.head_count", 2).str("qwen2.rope.scaling.type", "linear");
  d.f32("qwen2.rope.scaling.factor", 4).tensor("token_embd.weight", {8, 5}, kTypeF32, f32_bytes(pattern(40, 0)));
  const ModelConfig dc = read_model_config(write(d, "qwen2.gguf"));
  EXPECT_EQ(dc.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(dc.num_key_value_heads, 2);
  EXPECT_EQ(dc.head_dim, 4);
  EXPECT_EQ(dc.vocab_size, 5);
  EXPECT_EQ(dc.rope_theta, 10000.0);
  EXPECT_EQ(dc.max_position_embeddings, 2048);
  EXPECT_EQ(dc.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(dc.rope_scaling.factor, 4.0);
  EXPECT_TRUE(dc.attention_bias);
  EXPECT_EQ(dc.bos_token_id, -1);
  EXPECT_TRUE(dc.eos_token_ids.empty());
  TinyModel q3("qwen3");
  q3.head_dim = 8;
  q3.make();
  const ModelConfig qc = read_model_config(write(q3.gguf(), "qwen3.gguf"));
  EXPECT_EQ(qc.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(qc.qk_norm);
  EXPECT_EQ(qc.head_dim, 8);
  EXPECT_FALSE(qc.attention_bias);
  // llama with attention biases.
  TinyModel lb;
  lb.qkv_bias = true;
  lb.make();
  EXPECT_TRUE(read_model_config(write(lb.gguf(), "bias.gguf")).attention_bias);
}

// The same tiny model as a Hugging Face checkpoint and as a GGUF (q/k permuted, F32)
// gives the same logits: the loader reads GGUF rows in Hugging Face's order.
TEST_F(GgufTest, LoadsLikeTheSafetensorsCheckpoint) {
  TinyModel m;
  m.make();
  const std::string hf = dir_.file("hf");
  std::filesystem::create_directories(hf);
  std::vector<test::RawTensor> raw;
  for (const auto& [name, w] : m.weights) {
    const std::string b = f32_bytes(w.second);
    raw.push_back({name, "F32", w.first, std::vector<std::uint8_t>(b.begin(), b.end())});
  }
  test::write_safetensors(hf + "/model.safetensors", raw);
  const nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 8}, {"intermediate_size", 12},
      {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"vocab_size", 6},
      {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5f}, {"rope_theta", 500000.0}, {"tie_word_embeddings", false},
      {"bos_token_id", 1}, {"eos_token_id", 2}, {"hidden_act", "silu"}};
  test::write_file(hf + "/config.json", config.dump());
  const std::string gguf = write(m.gguf());
  ThreadPool pool(1);
  LoadOptions options;
  options.linear.type = LowBit::kFp32;
  options.numerics = Numerics::kWoq;  // the same rounding outside the matrix products (a GGUF's default is ggml's)
  auto a = LlamaModel::load(hf, options, pool);
  auto b = LlamaModel::load(gguf, options, pool);
  const std::vector<std::int32_t> tokens{1, 3, 0, 5, 4, 2};
  std::vector<float> la, lb;
  KVCache ca = a->make_cache(8), cb = b->make_cache(8);
  a->forward(tokens, ca, true, la);
  b->forward(tokens, cb, true, lb);
  ASSERT_EQ(la.size(), 36u);
  EXPECT_EQ(la, lb);
}

// ------------------------------------------------------------------ bad input

// A small valid file with metadata of every kind and two tensors.
GgufBuilder small_valid() {
  GgufBuilder g;
  g.str("general.architecture", "llama").u32("general.alignment", 32).u8("u8", 1).i8("i8", -1).u16("u16", 2);
  g.i16("i16", -2).i32("i32", 3).f32("f32", 0.5f).boolean("b", true).u64("u64", 4).i64("i64", -4).f64("f64", 0.25);
  g.strs("strs", {"x", "yz"}).nums<std::int32_t>("ints", kI32, {1, 2});
  std::vector<int> q(32, 1);
  g.tensor("t0", {3}, kTypeF32, f32_bytes({1, 2, 3})).tensor("t1", {32}, kTypeQ8_0, q8_0_block(1, q));
  return g;
}

// Every strict prefix of a valid file is refused with a woq::Error.
TEST_F(GgufTest, TruncatedAtEveryLength) {
  const std::string full = small_valid().bytes();
  ASSERT_NO_THROW(GgufFile{write(full)});
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::string p = write(full.substr(0, n), "cut.gguf");
    try {
      GgufFile f(p);
      ADD_FAILURE() << "a prefix of " << n << " of " << full.size() << " bytes was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cut.gguf"), std::string::npos) << what;
      EXPECT_TRUE(what.find("truncated") != std::string::npos || what.find("past the end") != std::string::npos ||
                  what.find("cannot fit") != std::string::npos || what.find("more than the file can hold") != std::string::npos)
          << n << ": " << what;
    }
  }
  // A model truncated the same way through the tensor source.
  TinyModel m;
  m.make();
  const std::string model = m.gguf().bytes();
  for (std::size_t n = 0; n < model.size(); n += 7) {
    const std::string p = write(model.substr(0, n), "cut.gguf");
    EXPECT_THROW(open_gguf_tensors(p), Error) << n;
  }
}

TEST_F(GgufTest, HeaderErrors) {
  GgufBuilder g = small_valid();
  g.magic = "GGUX";
  EXPECT_MENTIONS(GgufFile{write(g)}, "not a GGUF file", "GGUX");
  g.magic = "GGML";
  EXPECT_MENTIONS(GgufFile{write(g)}, "not a GGUF file");
  EXPECT_MENTIONS(GgufFile{write(std::string("GGU"))}, "truncated", "magic");
  EXPECT_MENTIONS(GgufFile{write(std::string())}, "truncated");
  EXPECT_MENTIONS(GgufFile{write(GgufBuilder(1))}, "version 1");
  EXPECT_MENTIONS(GgufFile{write(GgufBuilder(4))}, "version 4");
  EXPECT_MENTIONS(GgufFile{write(GgufBuilder(0))}, "version 0");
  // A big-endian file: the version and every count byte-swapped.
  std::string be = "GGUF" + le(__builtin_bswap32(3u)) + le(std::uint64_t{0}) + le(std::uint64_t{0});
  EXPECT_MENTIONS(GgufFile{write(be)}, "big-endian");
  // Counts beyond what the file can hold, refused before anything is allocated.
  GgufBuilder kv = small_valid();
  kv.kv_count = 1ull << 40;
  EXPECT_MENTIONS(GgufFile{write(kv)}, "metadata_kv_count", "1099511627776");
  kv.kv_count = ~0ull;
  EXPECT_MENTIONS(GgufFile{write(kv)}, "metadata_kv_count");
  GgufBuilder tc = small_valid();
  tc.tensor_count = 1ull << 59;
  EXPECT_MENTIONS(GgufFile{write(tc)}, "tensor_count");
  tc.tensor_count = 3;  // one more than there are: the third is read from the padding
  EXPECT_MENTIONS(GgufFile{write(tc)}, "tensor 2");
  GgufBuilder more = small_valid();
  more.kv_count = 15;  // one more pair than written: the tensor infos read as one
  EXPECT_THROW(GgufFile{write(more)}, Error);
}

TEST_F(GgufTest, MetadataErrors) {
  auto with = [&](auto&& add) {
    GgufBuilder g;
    g.str("general.architecture", "llama");
    add(g);
    return write(g);
  };
  // Arrays claiming more elements than the file holds.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("tokenizer.ggml.tokens", kStr, 1ull << 60, gstr("a")); })},
                  "'tokenizer.ggml.tokens'", "1152921504606846976 strings");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.ints", kU32, 1ull << 60, le(1u)); })}, "'a.ints'",
                  "elements of uint32");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.ints", kU64, ~0ull, le(1u)); })}, "'a.ints'");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.strs", kStr, 2, gstr("a")); })}, "'a.strs'",
                  "2 strings");
  // A string longer than the file.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.kv("general.name", kStr, le(1ull << 62) + "abc"); })},
                  "'general.name'", "truncated");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.kv("general.name", kStr, le(~0ull) + "abc"); })},
                  "'general.name'", "truncated");
  EXPECT_MENTIONS(GgufFile{write("GGUF" + le(3u) + le(0ull) + le(1ull) + le(1000ull) + std::string(20, 'k'))},
                  "the key of metadata pair 0", "truncated");
  // A string array element longer than the file.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.strs", kStr, 2, gstr("a") + le(1ull << 62)); })},
                  "'a.strs'[1]", "truncated");
  // Types.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.kv("a.x", 13, le(1u)); })}, "'a.x'", "unknown value type 13");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.kv("a.x", 0xffffffffu, le(1u)); })}, "'a.x'", "unknown value type");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.x", 13, 1, le(1u)); })}, "'a.x'", "unknown type 13");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.array("a.x", kArr, 1, le(kU8) + le(1ull) + "z"); })}, "'a.x'",
                  "array of arrays");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.kv("a.b", kBool, le<std::uint8_t>(2)); })}, "'a.b'", "bool");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.nums<std::uint8_t>("a.bs", kBool, {0, 7}); })}, "'a.bs'[1]", "bool");
  // Not UTF-8.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.u32("bad\xff.key", 1); })}, "key of metadata pair 1",
                  "not valid UTF-8", "bad\\xff.key");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.str("general.name", "ab\xc0\xaf"); })}, "'general.name'",
                  "not valid UTF-8");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.str("general.name", "\xed\xa0\x80"); })},  // a surrogate
                  "'general.name'", "not valid UTF-8");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.strs("tokenizer.ggml.tokens", {"ok", "\xe2\x82"}); })},
                  "'tokenizer.ggml.tokens'[1]", "not valid UTF-8");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.u32("", 1); })}, "empty key");
  // Duplicates.
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.u32("llama.block_count", 1).str("llama.block_count", "x"); })},
                  "duplicate metadata key 'llama.block_count'");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.u32("a\nb", 1).u32("a\nb", 2); })}, "duplicate metadata key 'a\\x0ab'");
  // general.alignment that is not a power of two, or not an integer.
  for (const std::uint32_t a : {3u, 0u, 48u, 1u << 31})
    EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.u32("general.alignment", a); })}, "general.alignment",
                    "power of two");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.str("general.alignment", "32"); })}, "general.alignment", "string");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.f32("general.alignment", 32); })}, "general.alignment");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.i32("general.alignment", -32); })}, "general.alignment");
  EXPECT_MENTIONS(GgufFile{with([](GgufBuilder& g) { g.u64("general.alignment", 1ull << 63); })}, "general.alignment");
  // Integer alignments of other widths are read (llama.cpp writes uint32).
  EXPECT_EQ(GgufFile{with([](GgufBuilder& g) { g.u64("general.alignment", 16); })}.alignment(), 16u);
}

TEST_F(GgufTest, TensorInfoErrors) {
  auto with = [&](auto&& add) {
    GgufBuilder g;
    add(g);
    return write(g);
  };
  const std::string four = f32_bytes({1, 2, 3, 4});
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {}, kTypeF32, four); })}, "tensor 'w'",
                  "0 dimensions");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1, 1, 1, 1, 4}, kTypeF32, four); })}, "tensor 'w'",
                  "5 dimensions");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4, 0}, kTypeF32, four); })}, "tensor 'w'",
                  "dimension 1 = 0");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1ull << 63}, kTypeF32, four); })}, "tensor 'w'",
                  "dimension 0");
  // Products overflowing int64 (and beyond 2^62 bytes).
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1u << 31, 1u << 31, 1u << 31}, kTypeF32, four); })},
                  "tensor 'w'", "dimension 2");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1ull << 62}, kTypeF32, four); })}, "tensor 'w'");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1ull << 61, 2}, 28 /* f64 */, four); })},
                  "tensor 'w'");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {(1ull << 62) - 32}, kTypeQ8_0, four); })},
                  "tensor 'w'");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {1ull << 40, 1ull << 21}, kTypeF32, four); })},
                  "tensor 'w'");
  // Types.
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, 4 /* q4_2, removed */, four); })},
                  "tensor 'w'", "unknown ggml type 4");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, 1000, four); })}, "unknown ggml type 1000");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {33}, kTypeQ4_0, std::string(36, 'x')); })},
                  "tensor 'w'", "33", "q4_0", "block of 32");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {128, 2}, kTypeQ6_K, std::string(420, 'x')); })},
                  "tensor 'w'", "q6_K", "256");
  // Names.
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w\xff", {4}, kTypeF32, four); })}, "name of tensor 0",
                  "not valid UTF-8");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("", {4}, kTypeF32, four); })}, "empty name");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, kTypeF32, four).tensor("w", {4}, kTypeF32, four); })},
                  "duplicate tensor 'w'");
  // Names are valid UTF-8 but may hold control characters: messages escape them.
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) {
                    g.tensor("\x1b[2J", {4}, kTypeF32, four).tensor("\x1b[2J", {4}, kTypeF32, four);
                  })},
                  "duplicate tensor '\\x1b[2J'");
  // Offsets: misaligned, past the end, overlapping.
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, kTypeF32, four, 4); })}, "tensor 'w'",
                  "offset 4", "general.alignment 32");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.alignment(64).tensor("w", {4}, kTypeF32, four, 32); })},
                  "tensor 'w'", "offset 32", "general.alignment 64");
  {
    GgufBuilder g;
    g.tensor("a", {4}, kTypeF32, four).tensor("w", {8}, kTypeF32, four + four);
    std::string b = g.bytes();
    b.pop_back();
    EXPECT_MENTIONS(GgufFile{write(b)}, "tensor 'w'", "past the end");
  }
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, kTypeF32, four, 1ull << 62); })}, "tensor 'w'",
                  "past the end");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) { g.tensor("w", {4}, kTypeF32, four, ~0ull << 5); })}, "tensor 'w'",
                  "past the end");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) {
                    g.tensor("a", {16}, kTypeF32, four + four + four + four).tensor("b", {4}, kTypeF32, four, 32);
                  })},
                  "'a' and 'b' overlap");
  EXPECT_MENTIONS(GgufFile{with([&](GgufBuilder& g) {  // listed out of order, same start
                    g.tensor("b", {4}, kTypeF32, four, 0).tensor("a", {4}, kTypeF32, four, 0);
                  })},
                  "overlap");
  // Two tensors sharing nothing but touching: fine.
  EXPECT_NO_THROW(GgufFile{with([&](GgufBuilder& g) { g.tensor("a", {8}, kTypeF32, four + four).tensor("b", {4}, kTypeF32, four, 32); })});
  // The padding before the data, cut.
  {
    GgufBuilder g;
    g.tensor("w", {4}, kTypeF32, four);
    const std::string b = g.bytes();
    EXPECT_MENTIONS(GgufFile{write(b.substr(0, b.size() - 16 - 1))}, "truncated", "tensor data would start");
  }
}

// llama.cpp's vocabulary loader ignores a special token id outside the vocabulary with a warning
// ("bad special token"), and its converter writes 0xFFFFFFFF for a padding id of -1: such files load.
TEST_F(GgufTest, TokenIdsOutsideTheVocabularyAreIgnoredWithAWarningExceptNone) {
  TinyModel m;
  m.make();
  auto config = [&](auto&& change) {
    GgufBuilder g;
    g.str("general.architecture", "llama");
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::uint32_t>>{
             {"context_length", 64}, {"embedding_length", 8}, {"feed_forward_length", 12}, {"block_count", 1},
             {"attention.head_count", 2}, {"attention.head_count_kv", 1}})
      g.u32("llama." + k, v);
    g.strs("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f"});
    change(g);
    return read_model_config(write(g));
  };
  const ModelConfig none = config([](GgufBuilder& g) {
    g.u32("tokenizer.ggml.bos_token_id", 1).u32("tokenizer.ggml.eos_token_id", 2);
    g.u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFF).i32("tokenizer.ggml.separator_token_id", -1);
  });
  EXPECT_TRUE(none.warnings.empty()) << none.warnings.front();
  EXPECT_EQ(none.bos_token_id, 1);
  EXPECT_EQ(none.eos_token_ids, (std::vector<std::int64_t>{2}));

  const ModelConfig bad = config([](GgufBuilder& g) {
    g.u32("tokenizer.ggml.eos_token_id", 6).u32("tokenizer.ggml.eot_token_id", 100).u32("tokenizer.ggml.eom_token_id", 4);
    g.u32("tokenizer.ggml.padding_token_id", 6).u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFF);
  });
  EXPECT_EQ(bad.bos_token_id, -1);
  EXPECT_EQ(bad.eos_token_ids, (std::vector<std::int64_t>{4}));  // eom alone is in the vocabulary
  ASSERT_EQ(bad.warnings.size(), 3u);  // eos, eot, padding; not bos's "none"
  EXPECT_NE(bad.warnings[0].find("'tokenizer.ggml.eos_token_id' = 6 is outside the vocabulary of 6 tokens"),
            std::string::npos) << bad.warnings[0];
  EXPECT_NE(bad.warnings[1].find("'tokenizer.ggml.eot_token_id' = 100"), std::string::npos) << bad.warnings[1];
  EXPECT_NE(bad.warnings[2].find("'tokenizer.ggml.padding_token_id' = 6"), std::string::npos) << bad.warnings[2];
}

TEST_F(GgufTest, ModelConfigErrors) {
  TinyModel m;
  m.make();
  // Each case: metadata of the tiny model with one change, and what the error names.
  auto config = [&](auto&& change) {
    GgufBuilder g;
    change(g);
    return read_model_config(write(g));
  };
  auto base = [&](GgufBuilder& g, const std::string& skip) {
    // The tiny model's metadata without the key `skip`.
    const std::string a = "llama.";
    if (skip != "arch") g.str("general.architecture", "llama");
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::uint32_t>>{
             {"context_length", 64}, {"embedding_length", 8}, {"feed_forward_length", 12}, {"block_count", 1},
             {"attention.head_count", 2}, {"attention.head_count_kv", 1}})
      if (k != skip) g.u32(a + k, v);
    if (skip != "tokens") g.strs("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f"});
  };
  EXPECT_NO_THROW(config([&](GgufBuilder& g) { base(g, ""); }));
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "arch"); }), "'general.architecture' is missing");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "arch"); g.str("general.architecture", "gpt2"); }),
                  "'general.architecture' is 'gpt2'", "llama");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "arch"); g.u32("general.architecture", 1); }),
                  "'general.architecture'", "expected a string");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "arch"); g.str("general.architecture", "\x1b[2J"); }),
                  "'\\x1b[2J'");
  for (const std::string key : {"embedding_length", "feed_forward_length", "block_count", "attention.head_count"}) {
    const std::string missing = "'llama." + key + "' is missing";
    EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, key); }), missing.c_str());
  }
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.u32("llama.expert_count", 8); }), "'llama.expert_count'",
                  "mixture-of-experts");
  EXPECT_NO_THROW(config([&](GgufBuilder& g) { base(g, ""); g.u32("llama.expert_count", 0); }));
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "attention.head_count_kv"); g.u32("llama.attention.head_count_kv", 3); }),
                  "'llama.attention.head_count_kv'", "(3) does not divide", "(2)");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) {
                    base(g, "attention.head_count_kv");
                    g.nums<std::uint32_t>("llama.attention.head_count_kv", kU32, {1});
                  }),
                  "'llama.attention.head_count_kv'", "per-layer array");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) {
                    base(g, "feed_forward_length");
                    g.nums<std::int32_t>("llama.feed_forward_length", kI32, {12, 12});
                  }),
                  "'llama.feed_forward_length'", "per-layer array");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.u32("llama.rope.dimension_count", 2); }),
                  "'llama.rope.dimension_count'", "partial rotary");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.u32("llama.attention.key_length", 5); }),
                  "'llama.attention.key_length'", "even");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.u32("llama.attention.value_length", 8); }),
                  "'llama.attention.value_length'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "embedding_length"); g.u32("llama.embedding_length", 9); }),
                  "'llama.attention.head_count'", "does not divide");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "block_count"); g.u32("llama.block_count", 0); }),
                  "'llama.block_count'", "is 0");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "block_count"); g.u64("llama.block_count", 1ull << 40); }),
                  "'llama.block_count'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "block_count"); g.i32("llama.block_count", -1); }),
                  "'llama.block_count'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "block_count"); g.f32("llama.block_count", 1); }),
                  "'llama.block_count'", "integer");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "block_count"); g.u64("llama.block_count", ~0ull); }),
                  "'llama.block_count'", "out of range");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "context_length"); g.u64("llama.context_length", 1ull << 30); }),
                  "'llama.context_length'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.f32("llama.attention.layer_norm_rms_epsilon", 0); }),
                  "'llama.attention.layer_norm_rms_epsilon'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.f32("llama.attention.layer_norm_rms_epsilon", NAN); }),
                  "'llama.attention.layer_norm_rms_epsilon'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.str("llama.attention.layer_norm_rms_epsilon", "1e-5"); }),
                  "'llama.attention.layer_norm_rms_epsilon'", "string");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.f64("llama.rope.freq_base", 1e300); }), "'llama.rope.freq_base'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.str("llama.rope.scaling.type", "yarn"); }),
                  "'llama.rope.scaling.type'", "'yarn'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) {
                    base(g, "");
                    g.str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 0.5f);
                  }),
                  "'llama.rope.scaling.factor'");
  // The vocabulary.
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "tokens"); }), "'tokenizer.ggml.tokens'", "'token_embd.weight'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "tokens"); g.strs("tokenizer.ggml.tokens", {}); }),
                  "a vocabulary of 0 tokens");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, "tokens"); g.nums<std::int32_t>("tokenizer.ggml.tokens", kI32, {1}); }),
                  "'tokenizer.ggml.tokens'", "array of strings");
  // Token ids: only a mistyped one is an error (an id outside the vocabulary is ignored, TokenIdsOutsideTheVocabulary).
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.str("tokenizer.ggml.bos_token_id", "1"); }),
                  "'tokenizer.ggml.bos_token_id'");
  // rope_freqs of the wrong size, type or values.
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.tensor("rope_freqs.weight", {4}, kTypeF32, f32_bytes({1, 1, 1, 1})); }),
                  "'rope_freqs.weight'", "[2]");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.tensor("rope_freqs.weight", {2}, kTypeF16, std::string(4, '\0')); }),
                  "'rope_freqs.weight'");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.tensor("rope_freqs.weight", {2}, kTypeF32, f32_bytes({1, -1})); }),
                  "'rope_freqs.weight'[1]");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) { base(g, ""); g.tensor("rope_freqs.weight", {2}, kTypeF32, f32_bytes({NAN, 1})); }),
                  "'rope_freqs.weight'[0]");
  EXPECT_MENTIONS(config([&](GgufBuilder& g) {
                    base(g, "");
                    g.str("llama.rope.scaling.type", "linear").tensor("rope_freqs.weight", {2}, kTypeF32, f32_bytes({1, 1}));
                  }),
                  "rope_freqs");
}

TEST_F(GgufTest, TensorSourceErrors) {
  TinyModel m;
  m.make();
  auto open_with = [&](auto&& add) {
    GgufBuilder g = m.gguf();
    add(g);
    return open_gguf_tensors(write(g));
  };
  EXPECT_NO_THROW(open_with([](GgufBuilder&) {}));
  EXPECT_MENTIONS(open_with([](GgufBuilder& g) { g.tensor("blk.0.foo.weight", {8}, kTypeF32, f32_bytes(pattern(8, 0))); }),
                  "'blk.0.foo.weight'", "not part of a llama model");
  EXPECT_MENTIONS(open_with([](GgufBuilder& g) { g.tensor("blk.0.\x1b[2J", {8}, kTypeF32, f32_bytes(pattern(8, 0))); }),
                  "'blk.0.\\x1b[2J'");
  EXPECT_MENTIONS(open_with([](GgufBuilder& g) { g.tensor("token_embd.bias", {8}, kTypeF32, f32_bytes(pattern(8, 0))); }),
                  "'token_embd.bias'");
  // A q projection whose rows disagree with the heads: refused by name, not read out of bounds.
  TinyModel bad = m;
  bad.weights["model.layers.0.self_attn.q_proj.weight"] = {{4, 8}, pattern(32, 0)};
  EXPECT_MENTIONS(open_gguf_tensors(write(bad.gguf(), "bad.gguf")), "'blk.0.attn_q.weight'", "expected 8 rows");
  // A tensor whose shape disagrees with the metadata: the message says where the expected shape comes from.
  bad = m;
  bad.weights["model.layers.0.mlp.gate_proj.weight"] = {{10, 8}, pattern(80, 0)};
  ThreadPool pool(1);
  LoadOptions f32;
  f32.linear.type = LowBit::kFp32;
  EXPECT_MENTIONS(LlamaModel::load(write(bad.gguf(), "bad.gguf"), f32, pool), "'blk.0.ffn_gate.weight' has shape [10, 8]",
                  "expected [12, 8] (from the GGUF metadata");
  bad = m;
  bad.weights["model.layers.0.self_attn.k_proj.weight"] = {{2, 4, 8}, pattern(64, 0)};
  EXPECT_MENTIONS(open_gguf_tensors(write(bad.gguf(), "bad.gguf")), "'blk.0.attn_k.weight'");
  bad = m;
  bad.weights["model.layers.0.self_attn.q_proj.weight"] = {{8, 2, 4}, pattern(64, 0)};
  EXPECT_MENTIONS(open_gguf_tensors(write(bad.gguf(), "bad.gguf")), "'blk.0.attn_q.weight'");
  // Heads so large that their row order would take terabytes: a clear error, no allocation.
  {
    GgufBuilder h;
    h.str("general.architecture", "llama").u32("llama.embedding_length", 8).u32("llama.feed_forward_length", 12);
    h.u32("llama.block_count", 1).u32("llama.attention.head_count", 1u << 20).u32("llama.attention.key_length", 1u << 20);
    h.strs("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f"});
    h.tensor("blk.0.attn_q.weight", {8, 8}, kTypeF32, f32_bytes(pattern(64, 0)));
    EXPECT_MENTIONS(open_gguf_tensors(write(h, "huge.gguf")), "'blk.0.attn_q.weight'", "rows");
  }
  // The loader refuses fused projections by name.
  GgufBuilder fused = m.gguf();
  fused.tensor("blk.0.attn_qkv.weight", {8, 16}, kTypeF32, f32_bytes(pattern(128, 0)));
  EXPECT_MENTIONS(LlamaModel::load(write(fused, "fused.gguf"), {}, pool), "'model.layers.0.self_attn.qkv_proj.weight'",
                  "fused projection");
  // A layer beyond block_count.
  GgufBuilder extra = m.gguf();
  extra.tensor("blk.1.ffn_up.weight", {8, 12}, kTypeF32, f32_bytes(pattern(96, 0)));
  EXPECT_MENTIONS(LlamaModel::load(write(extra, "extra.gguf"), {}, pool), "model.layers.1.mlp.up_proj.weight",
                  "beyond");
  // woq quantize runs the loader's validation before writing: every file the loader refuses, quantize to
  // GPTQ or GGUF refuses too, and writes nothing (it used to drop blk.1 from a GGUF, or write a checkpoint
  // no command loads).
  {
    TinyModel wide = m;
    wide.weights["model.embed_tokens.weight"] = {{6, 9}, pattern(54, 0)};
    TinyModel norm2d = m;
    norm2d.weights["model.norm.weight"] = {{1, 8}, pattern(8, 0)};
    TinyModel missing = m;
    missing.weights.erase("model.norm.weight");
    const std::vector<std::pair<std::string, std::string>> bad_files = {
        {write(extra, "extra.gguf"), "beyond the GGUF's block_count = 1"},
        {write(missing.gguf(), "no_norm.gguf"), "tensor 'model.norm.weight' is missing"},
        {write(norm2d.gguf(), "norm2d.gguf"), "'output_norm.weight'"},
        {write(wide.gguf(), "wide.gguf"), "'token_embd.weight'"}};
    for (const auto& [file, why] : bad_files) {
      EXPECT_MENTIONS(LlamaModel::load(file, {}, pool), why.c_str());
      QuantizeOptions q;
      q.spec = {LowBit::kSymInt8, 32, Int4Range::kFull};
      EXPECT_MENTIONS(quantize_checkpoint(file, path("out-gptq"), q, pool), why.c_str());
      EXPECT_FALSE(std::filesystem::exists(path("out-gptq"))) << file;
      EXPECT_MENTIONS(export_gguf(file, path("out.gguf"), {}, pool), why.c_str());
      EXPECT_FALSE(std::filesystem::exists(path("out.gguf"))) << file;
    }
  }
  // Config errors through the tensor source too.
  GgufBuilder moe = m.gguf();
  moe.u32("llama.expert_count", 4);
  EXPECT_MENTIONS(open_gguf_tensors(write(moe, "moe.gguf")), "'llama.expert_count'");
}

}  // namespace
}  // namespace woq
