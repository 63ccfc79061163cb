#include "tokenizer/gguf_vocab.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/utf8.h"
#include "io/json_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_backend.h"
#include "tokenizer/text_pipeline.h"

namespace woq {

namespace {

using Json = nlohmann::json;

// tokenizer.ggml.token_type values (llama_token_type; = SentencePiece's piece types).
enum TokenType : std::int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The metadata both kinds share, checked.
struct GgufVocab {
  std::vector<std::string> tokens;   ///< (n) token text, by id
  std::vector<std::int32_t> types;   ///< (n) TokenType
  std::optional<std::int32_t> bos, eos, unk;
  std::optional<bool> add_bos, add_eos;
};

std::string key_name(std::string_view key) { return fmt::format("tokenizer.ggml.{}", key); }

// The id stored under tokenizer.ggml.KEY; none when absent or outside the vocabulary (gguf_token_id).
std::optional<std::int32_t> token_id_key(const GgufFile& f, std::string_view key, std::size_t n) {
  const auto v = gguf_token_id(f, key, static_cast<std::int64_t>(n));
  if (!v) return std::nullopt;
  return static_cast<std::int32_t>(*v);
}

GgufVocab read_vocab(const GgufFile& f) {
  GgufVocab v;
  const std::string tokens_key = key_name("tokens");
  const auto* tokens = f.get_strings(tokens_key);
  if (tokens == nullptr)
    fail("{}: metadata '{}' is missing (a GGUF without a vocabulary has no tokenizer)", f.path(), tokens_key);
  const std::size_t n = tokens->size();
  if (n == 0) fail("{}: metadata '{}' is empty", f.path(), tokens_key);
  if (n > static_cast<std::size_t>(kMaxTokenId) + 1)
    fail("{}: metadata '{}' holds {} tokens; woq accepts at most {}", f.path(), tokens_key, n, kMaxTokenId + 1);
  v.tokens.reserve(n);
  TokenIds seen;
  seen.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    // llama.cpp names an empty token instead of refusing the file.
    std::string t = (*tokens)[i].empty() ? fmt::format("[EMPTY_{}]", i) : std::string((*tokens)[i]);
    if (const auto [it, fresh] = seen.emplace(t, static_cast<std::int32_t>(i)); !fresh)
      fail("{}: metadata '{}': token '{}' is both [{}] and [{}]", f.path(), tokens_key, printable(t), it->second, i);
    v.tokens.push_back(std::move(t));
  }
  v.types.assign(n, kNormal);
  const std::string types_key = key_name("token_type");
  if (const auto types = f.get_ints(types_key)) {
    if (types->size() != n)
      fail("{}: metadata '{}' has {} entries but '{}' has {}", f.path(), types_key, types->size(), tokens_key, n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t t = (*types)[i];
      if (t < kNormal || t > kByte)
        fail("{}: metadata '{}'[{}] = {} (token '{}') is not a token type (1 normal, 2 unknown, 3 control, "
             "4 user-defined, 5 unused, 6 byte)",
             f.path(), types_key, i, t, printable(v.tokens[i]));
      v.types[i] = static_cast<std::int32_t>(t);
    }
  }
  v.bos = token_id_key(f, "bos_token_id", n);
  v.eos = token_id_key(f, "eos_token_id", n);
  v.unk = token_id_key(f, "unknown_token_id", n);
  v.add_bos = f.get_bool(key_name("add_bos_token"));
  v.add_eos = f.get_bool(key_name("add_eos_token"));
  return v;
}

// The tokens around a sequence: BOS when add_bos, EOS when add_eos (each must exist).
SpecialTokens sequence_specials(const GgufFile& f, std::int32_t bos, std::int32_t eos, bool add_bos, bool add_eos) {
  SpecialTokens s;
  s.bos = bos;
  s.eos = eos;
  if (add_bos) {
    if (bos < 0)
      fail("{}: BOS is to be added but metadata '{}' is missing or outside the vocabulary", f.path(),
           key_name("bos_token_id"));
    s.prefix.push_back(bos);
  }
  if (add_eos) {
    if (eos < 0)
      fail("{}: EOS is to be added but metadata '{}' is missing or outside the vocabulary", f.path(),
           key_name("eos_token_id"));
    s.suffix.push_back(eos);
  }
  return s;
}

// ---- "llama": a SentencePiece ModelProto in protobuf's wire format ----

// Appends fields of one message (https://protobuf.dev/programming-guides/encoding/).
class ProtoWriter {
 public:
  void varint(int field, std::uint64_t value) {
    tag(field, 0);
    raw_varint(value);
  }
  void float32(int field, float value) {
    tag(field, 5);
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void bytes(int field, std::string_view value) {
    tag(field, 2);
    raw_varint(value.size());
    out_ += value;
  }
  const std::string& str() const { return out_; }

 private:
  void tag(int field, int wire_type) { raw_varint(static_cast<std::uint64_t>(field << 3 | wire_type)); }
  void raw_varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_ += static_cast<char>((v & 0x7f) | 0x80);
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

// Field numbers of sentencepiece_model.proto (google/sentencepiece src/).
namespace spm {
constexpr int kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr int kPiecePiece = 1, kPieceScore = 2, kPieceType = 3;
constexpr int kTrainerModelType = 3, kTrainerByteFallback = 35, kTrainerUnkPiece = 45, kTrainerBosPiece = 46,
              kTrainerEosPiece = 47;
constexpr int kModelTypeBpe = 2;
constexpr int kNormalizerName = 1, kNormalizerAddDummyPrefix = 3, kNormalizerRemoveExtraWhitespaces = 4,
              kNormalizerEscapeWhitespaces = 5;
}  // namespace spm

// llama.cpp's defaults for a llama vocabulary: BOS 1, EOS 2 (when they exist), BOS added.
std::int32_t llama_default_id(const GgufVocab& v, std::int32_t id) {
  return static_cast<std::size_t>(id) < v.tokens.size() ? id : -1;
}

// Refuses a control piece that SentencePiece's BPE would emit for text: its segmentation starts from single
// characters, merges them only into normal (also user-defined, unused) pieces, then looks each symbol up among the
// control, unknown and byte pieces first (ModelInterface::PieceToId). A control piece of one character, or with
// the text of a normal piece, is therefore found for text, and SentencePiece's Encode then fails with "Internal:
// ... all normalized characters are not consumed" (control pieces cover no text). `types` are the types the
// ModelProto gets.
void check_control_pieces(const GgufFile& f, const GgufVocab& v, const std::vector<std::int32_t>& types) {
  std::unordered_map<std::string_view, std::size_t> normal;  // text -> id of the pieces BPE merges into
  for (std::size_t i = 0; i < types.size(); ++i)
    if (types[i] == kNormal || types[i] == kUserDefined || types[i] == kUnused) normal.emplace(v.tokens[i], i);
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (types[i] != kControl) continue;
    const std::string& t = v.tokens[i];
    const bool one_char = t.size() == 1 || (!t.empty() && utf8_sequence_length(t, 0) == t.size());
    const auto same = normal.find(t);
    if (!one_char && same == normal.end()) continue;
    fail("{}: metadata '{}': token {} '{}' is a control token (type {}) {}; SentencePiece would produce it for "
         "text and fail (control tokens cover no text){}",
         f.path(), key_name("token_type"), i, printable_text(t), static_cast<int>(kControl),
         one_char ? "of one character, which its BPE starts every text from" : fmt::format("with the text of token {}", same->second),
         normal.empty() ? " (no token is a normal one)" : "");
  }
}

// The SentencePiece ModelProto (serialized) that tokens + scores + token_type stand for.
std::string llama_model_proto(const GgufFile& f, const GgufVocab& v) {
  const std::size_t n = v.tokens.size();
  const std::string scores_key = key_name("scores");
  const auto scores = f.get_floats(scores_key);
  if (!scores) fail("{}: metadata '{}' is missing (a SentencePiece vocabulary needs its scores)", f.path(), scores_key);
  if (scores->size() != n)
    fail("{}: metadata '{}' has {} entries but '{}' has {}", f.path(), scores_key, scores->size(), key_name("tokens"), n);
  // SentencePiece wants exactly one unknown piece: tokenizer.ggml.unknown_token_id (llama.cpp's
  // default 0); other tokens typed unknown (padding such as Phi-3's [PAD32011]) become unused.
  const std::int32_t unk = v.unk.value_or(0);
  const std::int32_t bos = v.bos.value_or(llama_default_id(v, 1)), eos = v.eos.value_or(llama_default_id(v, 2));
  std::vector<std::int32_t> types(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int32_t& type = types[i] = v.types[i];
    const auto id = static_cast<std::int32_t>(i);
    if (id == unk) type = kUnknown;
    else if (type == kUnknown) type = kUnused;
    // SentencePiece takes its BOS/EOS piece for BOS/EOS only when it is a control piece.
    else if (type == kNormal && (id == bos || id == eos)) type = kControl;
  }
  check_control_pieces(f, v, types);
  bool byte_fallback = false;
  ProtoWriter model;
  for (std::size_t i = 0; i < n; ++i) {
    byte_fallback |= types[i] == kByte;
    ProtoWriter piece;
    piece.bytes(spm::kPiecePiece, v.tokens[i]);
    piece.float32(spm::kPieceScore, (*scores)[i]);
    piece.varint(spm::kPieceType, static_cast<std::uint64_t>(types[i]));
    model.bytes(spm::kModelPieces, piece.str());
  }
  ProtoWriter trainer;
  trainer.varint(spm::kTrainerModelType, spm::kModelTypeBpe);
  trainer.varint(spm::kTrainerByteFallback, byte_fallback);
  trainer.bytes(spm::kTrainerUnkPiece, v.tokens[static_cast<std::size_t>(unk)]);
  // SentencePiece finds BOS/EOS by piece text (default "<s>", "</s>").
  if (bos >= 0) trainer.bytes(spm::kTrainerBosPiece, v.tokens[static_cast<std::size_t>(bos)]);
  if (eos >= 0) trainer.bytes(spm::kTrainerEosPiece, v.tokens[static_cast<std::size_t>(eos)]);
  model.bytes(spm::kModelTrainerSpec, trainer.str());
  ProtoWriter normalizer;  // no precompiled_charsmap: the text is not normalized (Llama's "identity")
  normalizer.bytes(spm::kNormalizerName, "identity");
  normalizer.varint(spm::kNormalizerAddDummyPrefix, f.get_bool(key_name("add_space_prefix")).value_or(true));
  normalizer.varint(spm::kNormalizerRemoveExtraWhitespaces,
                    f.get_bool(key_name("remove_extra_whitespaces")).value_or(false));
  normalizer.varint(spm::kNormalizerEscapeWhitespaces, 1);
  model.bytes(spm::kModelNormalizerSpec, normalizer.str());
  return model.str();
}

std::unique_ptr<TokenizerBackend> load_llama(const GgufFile& f, const GgufVocab& v) {
  SpecialTokens s = sequence_specials(f, v.bos.value_or(llama_default_id(v, 1)), v.eos.value_or(llama_default_id(v, 2)),
                                      v.add_bos.value_or(true), v.add_eos.value_or(false));
  return load_sentencepiece_proto(llama_model_proto(f, v), f.path() + ": tokenizer.ggml.tokens/scores/token_type",
                                  std::move(s), fmt::format("GGUF llama (SentencePiece, {} tokens)", v.tokens.size()));
}

// ---- "gpt2": byte-level BPE ----

// The pre-tokenizers tokenizer.ggml.pre names, as llama.cpp's llm_tokenizer_bpe splits the text: each regex
// of the list splits every piece into its matches and the text between them (tokenizer.json's Split with
// behavior Isolated), then the bytes become GPT-2's byte-level characters. Most regexes are the model's
// tokenizer.json patterns; where llama.cpp rewrites (?i:...) for its regex engine (llama3, qwen2, tekken) the
// original is kept, which PCRE2 runs as Hugging Face does. Beyond llama.cpp, qwen2 normalizes to NFC as its
// tokenizer.json does.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kCjkRegex = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// deepseek-llm's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, ... (tokenizer.json lists the ranges).
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C})"
    R"(\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5})"
    R"(\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B})"
    R"(\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45})"
    R"(\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4})"
    R"(\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115})"
    R"(\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139})"
    R"(\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB})"
    R"(\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kBloomRegex = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

struct PreTokenizerSpec {
  std::vector<std::string_view> names;  ///< tokenizer.ggml.pre values
  std::vector<const char*> regexes;     ///< Split (Isolated) steps, in order, before the byte-level mapping
  bool ignore_merges = false;           ///< a word found whole in the vocabulary is one token
  bool add_bos = false;                 ///< llama.cpp's add_bos default
  bool nfc = false;                     ///< NFC normalizer (Qwen2's tokenizer.json)
};

const std::vector<PreTokenizerSpec>& pre_tokenizer_specs() {
  static const std::vector<PreTokenizerSpec> specs = {
      // llama.cpp's own, for files without tokenizer.ggml.pre.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Regex}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Regex}},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2Regex}, false, false, true},
      {{"stablelm2", "megrez"}, {kQwen2Regex}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", "gigachat", "jina-es", "jina-de", "jina-v1-en",
        "jina-v2-es", "jina-v2-de", "jina-v2-code"},
       {kGpt2Regex}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2Regex}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Regex, "[0-9][0-9][0-9]"}},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)", kCjkRegex,
        R"(\p{N}+)"}},
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkRegex, R"(\p{N})"}},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
        R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloomRegex}},
      {{"viking"}, {kBloomRegex, R"(\p{N})"}},
      {{"tekken"},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
        R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true, true},
  };
  return specs;
}

const PreTokenizerSpec& pre_tokenizer_spec(const GgufFile& f, std::string_view name) {
  for (const PreTokenizerSpec& s : pre_tokenizer_specs())
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return s;
  std::string known;
  for (const std::string_view n : gguf_pre_tokenizers()) known += (known.empty() ? "" : ", ") + std::string(n);
  fail("{}: metadata '{}' is '{}', a pre-tokenizer woq does not have (woq has {})", f.path(), key_name("pre"),
       printable(name), known);
}

// The tokenizer.json pre_tokenizer that `spec` stands for: its Splits, then the byte-level mapping.
Json pre_tokenizer_json(const PreTokenizerSpec& spec) {
  Json steps = Json::array();
  for (const char* re : spec.regexes)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
}

// What a gpt2 vocabulary adds to the tokens: the pre-tokenizer and the merges.
struct Gpt2Vocab {
  std::string_view pre;
  const PreTokenizerSpec* spec = nullptr;
  std::vector<std::pair<std::string, std::string>> merges;
  bool add_bos = false, add_eos = false;
};

Gpt2Vocab read_gpt2(const GgufFile& f, const GgufVocab& v) {
  Gpt2Vocab g;
  g.pre = f.get_string(key_name("pre")).value_or("default");  // llama.cpp's fallback
  g.spec = &pre_tokenizer_spec(f, g.pre);
  const std::string merges_key = key_name("merges");
  const auto* merges_kv = f.get_strings(merges_key);
  if (merges_kv == nullptr)
    fail("{}: metadata '{}' is missing (a byte-level BPE vocabulary needs its merges)", f.path(), merges_key);
  g.merges.reserve(merges_kv->size());
  for (std::size_t i = 0; i < merges_kv->size(); ++i) {
    const std::string_view m = (*merges_kv)[i];
    const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;  // as llama.cpp splits them
    if (sp == std::string_view::npos)
      fail("{}: metadata '{}'[{}] = '{}' is not two tokens separated by a space", f.path(), merges_key, i, printable(m));
    g.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
  }
  g.add_bos = v.add_bos.value_or(g.spec->add_bos);
  g.add_eos = v.add_eos.value_or(false);
  return g;
}

// llama.cpp matches control, unknown and user-defined tokens in the raw text; the first two are
// special (decode drops them). User-defined tokens are stored as their text.
bool is_added(std::int32_t type) { return type == kControl || type == kUnknown || type == kUserDefined; }

std::unique_ptr<TokenizerBackend> load_gpt2(const GgufFile& f, const GgufVocab& v) {
  const std::size_t n = v.tokens.size();
  Gpt2Vocab g = read_gpt2(f, v);
  std::vector<std::pair<std::string, std::int32_t>> vocab;
  vocab.reserve(n);
  HfTokenizerParts parts;
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::int32_t>(i);
    vocab.emplace_back(v.tokens[i], id);
    if (is_added(v.types[i])) parts.added.push_back({v.tokens[i], id, false, false, false, false, v.types[i] != kUserDefined});
  }
  BpeOptions options;
  options.ignore_merges = g.spec->ignore_merges;
  parts.model = std::make_unique<BpeModel>(vocab, g.merges, std::move(options), f.path() + ": " + key_name("merges"));
  const std::string where = fmt::format("{}: {} '{}'", f.path(), key_name("pre"), g.pre);
  if (g.spec->nfc) parts.normalizer = hf::make_normalizer({{"type", "NFC"}}, where);
  parts.pre_tokenizer = hf::make_pre_tokenizer(pre_tokenizer_json(*g.spec), where);
  parts.decoder = hf::gpt2_decoder();
  parts.specials = sequence_specials(f, v.bos.value_or(-1), v.eos.value_or(-1), g.add_bos, g.add_eos);
  parts.description = fmt::format("GGUF gpt2 (byte-level BPE, pre-tokenizer {}, {} tokens)", g.pre, n);
  return std::make_unique<HfTokenizer>(std::move(parts), f.path());
}

// tokenizer.json (the tokenizers library's serialization) of a gpt2 vocabulary: the same parts load_gpt2 builds.
Json gpt2_tokenizer_json(const GgufFile& f, const GgufVocab& v) {
  const Gpt2Vocab g = read_gpt2(f, v);
  Json added = Json::array(), vocab = Json::object(), merges = Json::array();
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    vocab[v.tokens[i]] = i;
    if (is_added(v.types[i]))
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", v.types[i] != kUserDefined}});
  }
  for (const auto& [a, b] : g.merges) merges.push_back(Json::array({a, b}));
  // BOS/EOS around each sequence as a TemplateProcessing, as Llama 3's tokenizer.json adds BOS.
  Json post = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  if (g.add_bos || g.add_eos) {
    const std::optional<std::int32_t> bos = g.add_bos ? v.bos : std::nullopt, eos = g.add_eos ? v.eos : std::nullopt;
    if ((g.add_bos && !bos) || (g.add_eos && !eos))
      fail("{}: BOS/EOS is to be added but its tokenizer.ggml.*_token_id is missing", f.path());
    Json specials = Json::object();
    // One sequence with its BOS/EOS (as Llama 3's tokenizer.json: a pair is the two one after the other).
    auto sequence = [&](const char* id, int type_id) {
      Json out = Json::array();
      auto special = [&](std::int32_t token) {
        const std::string& t = v.tokens[static_cast<std::size_t>(token)];
        specials[t] = {{"id", t}, {"ids", {token}}, {"tokens", {t}}};
        out.push_back({{"SpecialToken", {{"id", t}, {"type_id", type_id}}}});
      };
      if (bos) special(*bos);
      out.push_back({{"Sequence", {{"id", id}, {"type_id", type_id}}}});
      if (eos) special(*eos);
      return out;
    };
    const Json single = sequence("A", 0);
    Json pair = single;
    for (const Json& step : sequence("B", 1)) pair.push_back(step);
    post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", g.spec->nfc ? Json{{"type", "NFC"}} : Json()},
          {"pre_tokenizer", pre_tokenizer_json(*g.spec)},
          {"post_processor", std::move(post)},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", g.spec->ignore_merges},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)}}}};
}

// tokenizer.ggml.model, checked to be one woq has.
std::string_view vocab_model(const GgufFile& file) {
  const std::string model_key = key_name("model");
  const auto model = file.get_string(model_key);
  if (!model) fail("{}: metadata '{}' is missing (a GGUF without a vocabulary has no tokenizer)", file.path(), model_key);
  if (*model != "llama" && *model != "gpt2")
    fail("{}: metadata '{}' is '{}', a tokenizer woq does not have (woq has llama = SentencePiece, gpt2 = byte-level "
         "BPE)",
         file.path(), model_key, printable(*model));
  return *model;
}

}  // namespace

std::vector<std::string_view> gguf_pre_tokenizers() {
  std::vector<std::string_view> names;
  for (const PreTokenizerSpec& s : pre_tokenizer_specs()) names.insert(names.end(), s.names.begin(), s.names.end());
  return names;
}

std::unique_ptr<TokenizerBackend> load_gguf_vocab(const GgufFile& file) {
  const std::string_view model = vocab_model(file);
  const GgufVocab vocab = read_vocab(file);
  return model == "llama" ? load_llama(file, vocab) : load_gpt2(file, vocab);
}

std::vector<std::string> write_hf_tokenizer(const GgufFile& file, const std::string& dir) {
  const std::string_view model = vocab_model(file);
  const GgufVocab v = read_vocab(file);
  const auto token = [&](std::optional<std::int32_t> id) {  // its text; null for none (or -1)
    return id && *id >= 0 ? nlohmann::ordered_json(v.tokens[static_cast<std::size_t>(*id)]) : nlohmann::ordered_json();
  };
  const std::filesystem::path out(dir);
  nlohmann::ordered_json config;
  std::vector<std::string> written;
  if (model == "llama") {
    write_text_file((out / "tokenizer.model").string(), llama_model_proto(file, v));
    written.push_back("tokenizer.model");
    config["tokenizer_class"] = "LlamaTokenizer";
    config["add_bos_token"] = v.add_bos.value_or(true);
    config["add_eos_token"] = v.add_eos.value_or(false);
    config["bos_token"] = token(v.bos.value_or(llama_default_id(v, 1)));
    config["eos_token"] = token(v.eos.value_or(llama_default_id(v, 2)));
    config["unk_token"] = token(v.unk.value_or(0));
  } else {
    write_json_file((out / "tokenizer.json").string(), gpt2_tokenizer_json(file, v));
    written.push_back("tokenizer.json");
    config["tokenizer_class"] = "PreTrainedTokenizerFast";
    config["bos_token"] = token(v.bos);
    config["eos_token"] = token(v.eos);
  }
  config["clean_up_tokenization_spaces"] = false;
  if (const auto t = file.get_string("tokenizer.chat_template")) {
    if (t->size() > kMaxJsonFileBytes / 2)
      fail("{}: metadata 'tokenizer.chat_template' is {} bytes, more than tokenizer_config.json can hold ({} MiB)",
           file.path(), t->size(), kMaxJsonFileBytes / 2 >> 20);
    config["chat_template"] = *t;
  }
  write_json_file((out / "tokenizer_config.json").string(), config);
  written.push_back("tokenizer_config.json");
  return written;
}

std::unique_ptr<TokenizerBackend> load_gguf_vocab(const std::string& path) {
  return load_gguf_vocab(shared_gguf(path)->front());
}

}  // namespace woq
