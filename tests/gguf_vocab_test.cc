// The tokenizer GGUF files embed (tokenizer/gguf_vocab.h) against llama.cpp's
// vocabulary tests: llama.cpp's own vocab-only GGUFs (tests/data/llama.cpp-vocab)
// and GGUFs written here from the
// bundled Llama 3 and Qwen3 tokenizer.json the way convert_hf_to_gguf.py writes
// them; special tokens, decoding, and malformed vocabularies.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf_writer.h"
#include "test_files.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/sentencepiece_backend.h"
#include "tokenizer/text_pipeline.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

using nlohmann::json;
using Ids = std::vector<std::int32_t>;

const std::string kAssets = WOQ_ASSETS_DIR;
const std::string kVocabDir = std::string(WOQ_TEST_DATA) + "/llama.cpp-vocab";

// ---- llama.cpp's tests on real GGUF vocabularies ----

struct VocabFile {
  const char* name;      ///< ggml-vocab-NAME.gguf
  const char* describe;  ///< what describe() starts with
};
void PrintTo(const VocabFile& v, std::ostream* os) { *os << v.name; }

// The file in the repository (a missing one fails the test: it is the reference).
std::string vocab_base(const std::string& name) {
  const std::string base = kVocabDir + "/ggml-vocab-" + name + ".gguf";
  EXPECT_TRUE(std::filesystem::exists(base) && std::filesystem::exists(base + ".inp")) << base << "(.inp) is missing";
  return base;
}

// Every case encodes to llama.cpp's ids (no BOS), and decodes back to the text.
void expect_vocab_cases(const Tokenizer& tok, const std::string& base) {
  const auto cases = test::llama_cpp_vocab_cases(base);
  ASSERT_GE(cases.size(), 40u);
  int passed = 0;
  for (const auto& [text, want] : cases) {
    const Ids got = tok.encode(text, /*add_special=*/false);
    EXPECT_EQ(got, want) << "text: '" << printable(text) << "'";
    passed += got == want;
    // SentencePiece's decoder drops the space its dummy prefix stands for.
    EXPECT_EQ(tok.decode(got), text) << "decode of '" << printable(text) << "'";
  }
  std::printf("%s: %d/%zu cases\n", tok.describe().c_str(), passed, cases.size());
}

class RealGguf : public ::testing::TestWithParam<VocabFile> {};

TEST_P(RealGguf, EveryCaseMatchesLlamaCpp) {
  const std::string base = vocab_base(GetParam().name);
  const Tokenizer tok = Tokenizer::load(base);
  EXPECT_TRUE(tok.describe().starts_with(GetParam().describe)) << tok.describe();
  expect_vocab_cases(tok, base);
}

// The Hugging Face files written from the GGUF (woq quantize from a GGUF to GPTQ) load as the same tokenizer:
// llama.cpp's cases, the special tokens around a sequence, BOS/EOS.
TEST_P(RealGguf, HuggingFaceFilesWrittenFromItTokenizeTheSame) {
  const std::string base = vocab_base(GetParam().name);
  const test::TempDir dir;
  const std::vector<std::string> files = write_hf_tokenizer(GgufFile(base), dir.path());
  const bool spm = std::string_view(GetParam().describe).starts_with("GGUF llama");
  EXPECT_EQ(files, (std::vector<std::string>{spm ? "tokenizer.model" : "tokenizer.json", "tokenizer_config.json"}));
  const Tokenizer gguf = Tokenizer::load(base), hf = Tokenizer::load(dir.path());
  EXPECT_TRUE(hf.describe().starts_with(spm ? "SentencePiece tokenizer.model" : "tokenizer.json BPE")) << hf.describe();
  expect_vocab_cases(hf, base);
  EXPECT_EQ(hf.bos_id(), gguf.bos_id());
  EXPECT_EQ(hf.eos_id(), gguf.eos_id());
  EXPECT_EQ(hf.add_bos(), gguf.add_bos());
  for (const auto& [text, ids] : test::llama_cpp_vocab_cases(base)) {
    EXPECT_EQ(hf.encode(text), gguf.encode(text)) << "text: '" << printable(text) << "'";
    EXPECT_EQ(hf.encode_with_special(text), gguf.encode_with_special(text)) << "text: '" << printable(text) << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Vocab, RealGguf,
    ::testing::Values(VocabFile{"llama-spm", "GGUF llama (SentencePiece, 32000 tokens)"},
                      VocabFile{"phi-3", "GGUF llama (SentencePiece, 32064 tokens)"},
                      VocabFile{"gpt-2", "GGUF gpt2 (byte-level BPE, pre-tokenizer gpt-2, 50257 tokens)"},
                      VocabFile{"deepseek-coder", "GGUF gpt2 (byte-level BPE, pre-tokenizer deepseek-coder"},
                      VocabFile{"mpt", "GGUF gpt2 (byte-level BPE, pre-tokenizer mpt"},
                      VocabFile{"starcoder", "GGUF gpt2 (byte-level BPE, pre-tokenizer starcoder"},
                      VocabFile{"deepseek-llm", "GGUF gpt2 (byte-level BPE, pre-tokenizer deepseek-llm"},
                      VocabFile{"falcon", "GGUF gpt2 (byte-level BPE, pre-tokenizer falcon"},
                      VocabFile{"refact", "GGUF gpt2 (byte-level BPE, pre-tokenizer refact"}),
    [](const auto& param_info) {
      std::string n = param_info.param.name;
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

// ---- GGUFs written from tokenizer.json, as convert_hf_to_gguf.py does ----

// tokenizer.json's vocabulary and merges as tokenizer.ggml.* keys: tokens by id, added
// tokens typed control (special) or user-defined, ids without a token "[PADn]".
GgufWriter gguf_from_tokenizer_json(const std::string& dir, const std::string& pre) {
  const json j = json::parse(test::read_file(dir + "/tokenizer.json"));
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  const auto put = [&](const std::string& t, std::size_t id, std::int32_t type) {
    if (id >= tokens.size()) {
      for (std::size_t i = tokens.size(); i <= id; ++i) tokens.push_back("[PAD" + std::to_string(i) + "]");
      types.resize(id + 1, 4);
    }
    tokens[id] = t;
    types[id] = type;
  };
  for (const auto& [t, id] : j["model"]["vocab"].items()) put(t, id.get<std::size_t>(), 1);
  for (const json& a : j["added_tokens"]) put(a["content"], a["id"].get<std::size_t>(), a["special"].get<bool>() ? 3 : 4);
  std::vector<std::string> merges;
  for (const json& m : j["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", merges);
  return w;
}

TEST(GgufVocab, Llama3AndQwen2PreTokenizersMatchLlamaCpp) {
  const test::TempDir dir;
  GgufWriter llama3 = gguf_from_tokenizer_json(kAssets + "/tokenizers/llama3", "llama-bpe");
  llama3.set_u32("tokenizer.ggml.bos_token_id", 128000);
  llama3.set_u32("tokenizer.ggml.eos_token_id", 128009);
  llama3.write(dir.file("llama3.gguf"));
  const Tokenizer l = Tokenizer::load(dir.file("llama3.gguf"));
  expect_vocab_cases(l, kVocabDir + "/ggml-vocab-llama-bpe.gguf");
  // llama-bpe adds BOS by default (llama.cpp); special tokens in the text become their ids.
  EXPECT_EQ(l.encode("Hello<|eot_id|>"), (Ids{128000, 9906, 128009}));
  EXPECT_EQ(l.decode({128000, 9906, 128009}), "Hello");
  EXPECT_EQ(l.eos_id(), 128009);

  gguf_from_tokenizer_json(kAssets + "/tokenizers/qwen3", "qwen2").write(dir.file("qwen.gguf"));
  const Tokenizer q = Tokenizer::load(dir.file("qwen.gguf"));
  expect_vocab_cases(q, kVocabDir + "/ggml-vocab-qwen2.gguf");
  EXPECT_FALSE(q.add_bos());
  EXPECT_EQ(q.encode("<|im_start|>user"), (Ids{151644, 872}));
  EXPECT_EQ(q.encode("caf" "e\xCC\x81"), q.encode("caf\xC3\xA9"));  // Qwen2 normalizes to NFC
}

// The tokenizer.json written from llama.cpp's byte-level BPE GGUFs, run by Hugging Face's own
// implementation (@huggingface/tokenizers, tests/tokenizer/hf_oracle.mjs): llama.cpp's expected ids.
TEST(GgufVocab, TokenizerJsonWrittenFromGgufMatchesHuggingFaceTokenizers) {
  const test::TempDir dir;
  std::vector<std::string> bases;
  json cases = json::array();
  // Llama 3 and Qwen2 from GGUFs made of the bundled tokenizer.json files, and llama.cpp's own files.
  GgufWriter llama3 = gguf_from_tokenizer_json(kAssets + "/tokenizers/llama3", "llama-bpe");
  llama3.set_u32("tokenizer.ggml.bos_token_id", 128000);
  llama3.write(dir.file("llama-bpe.gguf"));
  gguf_from_tokenizer_json(kAssets + "/tokenizers/qwen3", "qwen2").write(dir.file("qwen2.gguf"));
  const std::vector<std::pair<std::string, std::string>> files = {
      {dir.file("llama-bpe.gguf"), kVocabDir + "/ggml-vocab-llama-bpe.gguf"},
      {dir.file("qwen2.gguf"), kVocabDir + "/ggml-vocab-qwen2.gguf"},
      {vocab_base("gpt-2"), vocab_base("gpt-2")},
      {vocab_base("deepseek-coder"), vocab_base("deepseek-coder")},
      {vocab_base("mpt"), vocab_base("mpt")}};
  std::vector<std::vector<std::pair<std::string, Ids>>> want;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string out = dir.file("hf" + std::to_string(i));
    std::filesystem::create_directories(out);
    write_hf_tokenizer(GgufFile(files[i].first), out);
    want.push_back(test::llama_cpp_vocab_cases(files[i].second));
    json texts = json::array();
    for (const auto& c : want.back()) texts.push_back(c.first);
    cases.push_back({{"dir", out}, {"texts", texts}});
  }
  const std::string out = test::run_hf_oracle(cases.dump(), dir);
  if (out.empty()) WOQ_SKIP_WITHOUT_REFERENCE("node or @huggingface/tokenizers is missing (npm ci --prefix tests/tokenizer)");
  const json got = json::parse(out);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const Tokenizer gguf = Tokenizer::load(files[i].first);
    int same = 0;
    for (std::size_t c = 0; c < want[i].size(); ++c) {
      const std::string& text = want[i][c].first;
      const Ids ids = got[i][c]["plain_ids"].get<Ids>();
      EXPECT_EQ(ids, want[i][c].second) << files[i].second << ": '" << printable(text) << "'";
      same += ids == want[i][c].second;
      // With the special tokens around the sequence (BOS where llama.cpp adds it): as the GGUF's own.
      EXPECT_EQ(got[i][c]["ids"].get<Ids>(), gguf.encode(text)) << files[i].second << ": '" << printable(text) << "'";
    }
    std::printf("%s: %d/%zu cases as @huggingface/tokenizers encodes the written tokenizer.json\n",
                files[i].second.c_str(), same, want[i].size());
  }
}

// ---- special tokens and decoding on the real files ----

TEST(GgufVocab, SentencePieceSpecialsAndBytes) {
  const Tokenizer tok = Tokenizer::load(kVocabDir + "/ggml-vocab-llama-spm.gguf");
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.encode("Hello"), (Ids{1, 15043}));
  EXPECT_EQ(tok.encode("Hello</s>", false), (Ids{15043, 2}));  // control tokens in the text
  // Byte tokens <0xNN> (id 3 + NN): 中 is E4 B8 AD; a lone byte decodes as U+FFFD.
  EXPECT_EQ(tok.decode({3 + 0xE4, 3 + 0xB8, 3 + 0xAD}), "中");
  EXPECT_EQ(tok.decode({3 + 0xE4}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.token_text(3 + 0x41), "A");
  EXPECT_EQ(tok.token_text(15043), " Hello");
  EXPECT_EQ(tok.decode({1, 15043, 2}), "Hello");  // BOS/EOS decode to nothing
  // Phi-3: EOS <|endoftext|>, <|end|> a control token found in the text, padding typed unknown.
  const Tokenizer phi3 = Tokenizer::load(kVocabDir + "/ggml-vocab-phi-3.gguf");
  EXPECT_EQ(phi3.eos_id(), 32000);
  EXPECT_EQ(phi3.encode("Hi<|end|>", false), (Ids{6324, 32007}));
  EXPECT_EQ(phi3.decode({6324, 32007}), "Hi");
}

TEST(GgufVocab, ByteLevelSpecials) {
  const Tokenizer gpt2 = Tokenizer::load(kVocabDir + "/ggml-vocab-gpt-2.gguf");
  EXPECT_FALSE(gpt2.add_bos());  // gpt2 vocabularies add BOS only when the file says so
  EXPECT_EQ(gpt2.bos_id(), 50256);
  EXPECT_EQ(gpt2.eos_id(), 50256);
  EXPECT_EQ(gpt2.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(gpt2.encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
  EXPECT_EQ(gpt2.decode({15496, 50256, 995}), "Hello world");
  EXPECT_EQ(gpt2.token_text(995), " world");
  // deepseek-coder says add_bos_token true.
  const Tokenizer coder = Tokenizer::load(kVocabDir + "/ggml-vocab-deepseek-coder.gguf");
  EXPECT_TRUE(coder.add_bos());
  EXPECT_EQ(coder.bos_id(), 32013);
  EXPECT_EQ(coder.encode("x", true).front(), 32013);
}

// ---- small vocabularies written here; malformed ones ----

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then ▁ a b ▁a ab.
GgufWriter tiny_llama() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<std::int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  for (const char* t : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab"}) {
    tokens.push_back(t);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (std::size_t i = 259; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i - 259);
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_f32s("tokenizer.ggml.scores", scores);
  w.set_i32s("tokenizer.ggml.token_type", types);
  return w;
}

// A byte-level BPE vocabulary: the 256 byte characters, then Ġa (merge "Ġ a") and <|end|> (control).
GgufWriter tiny_gpt2() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(hf::byte_level_char(static_cast<unsigned char>(b)));
  tokens.push_back("\xC4\xA0" "a");
  tokens.push_back("<|end|>");
  std::vector<std::int32_t> types(tokens.size(), 1);
  types.back() = 3;
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-2");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", {"\xC4\xA0 a"});
  return w;
}

// `w` with the keys `edit` sets (replacing those it has).
GgufWriter with(GgufWriter w, const std::function<void(GgufWriter&)>& edit) {
  edit(w);
  return w;
}

TEST(GgufVocab, SmallVocabularies) {
  const test::TempDir dir;
  with(tiny_llama(), [](GgufWriter& w) {
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_bool("tokenizer.ggml.add_eos_token", true);
  }).write(dir.file("l.gguf"));
  const Tokenizer l = Tokenizer::load(dir.file("l.gguf"));
  EXPECT_EQ(l.describe(), "GGUF llama (SentencePiece, 264 tokens)");
  EXPECT_EQ(l.encode("ab a"), (Ids{1, 262, 261, 262, 2}));  // ▁a b ▁a with BOS and EOS; "ab" loses to "▁a"
  EXPECT_EQ(l.encode("c", false), (Ids{259, 3 + 'c'}));     // byte fallback
  EXPECT_EQ(l.decode(l.encode("ab ca")), "ab ca");
  // BOS/EOS typed normal (as in a GGUF without token types): the tokenizer.model written from it still adds BOS.
  with(tiny_llama(), [](GgufWriter& w) {
    std::vector<std::int32_t> types(264, 1);
    types[0] = 2;
    std::fill(types.begin() + 3, types.begin() + 259, 6);
    w.set_i32s("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
  }).write(dir.file("normal_bos.gguf"));
  std::filesystem::create_directories(dir.file("normal_bos"));
  write_hf_tokenizer(GgufFile(dir.file("normal_bos.gguf")), dir.file("normal_bos"));
  const Tokenizer nb = Tokenizer::load(dir.file("normal_bos.gguf")), nb_hf = Tokenizer::load(dir.file("normal_bos"));
  EXPECT_EQ(nb_hf.encode("ab a"), nb.encode("ab a"));
  EXPECT_EQ(nb_hf.encode("ab a").front(), 1);
  EXPECT_EQ(nb_hf.bos_id(), 1);
  with(tiny_llama(), [](GgufWriter& w) { w.set_bool("tokenizer.ggml.add_space_prefix", false); }).write(dir.file("np.gguf"));
  EXPECT_EQ(Tokenizer::load(dir.file("np.gguf")).encode("a", false), (Ids{260}));

  with(tiny_gpt2(), [](GgufWriter& w) {
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_u32("tokenizer.ggml.bos_token_id", 257);
  }).write(dir.file("g.gguf"));
  const Tokenizer g = Tokenizer::load(dir.file("g.gguf"));
  EXPECT_EQ(g.describe(), "GGUF gpt2 (byte-level BPE, pre-tokenizer gpt-2, 258 tokens)");
  EXPECT_EQ(g.encode("a a<|end|>"), (Ids{257, 'a', 256, 257}));
  EXPECT_EQ(g.decode({'a', 256, 257}), "a a");
  // tokenizer.ggml.pre absent: llama.cpp's "default".
  GgufWriter nopre;
  nopre.set_string("tokenizer.ggml.model", "gpt2");
  nopre.set_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
  nopre.set_strings("tokenizer.ggml.merges", {"a b"});
  nopre.write(dir.file("nopre.gguf"));
  EXPECT_EQ(Tokenizer::load(dir.file("nopre.gguf")).encode("ab"), (Ids{2}));
  // A split set: the tokenizer is read from the first part.
  with(tiny_gpt2(), [](GgufWriter& w) {
    w.set_u32("split.no", 0);
    w.set_u32("split.count", 2);
  }).write(dir.file("m-00001-of-00002.gguf"));
  GgufWriter second;
  second.set_u32("split.no", 1);
  second.set_u32("split.count", 2);
  second.write(dir.file("m-00002-of-00002.gguf"));
  EXPECT_EQ(Tokenizer::load(dir.file("m-00002-of-00002.gguf")).encode(" a"), (Ids{256}));
}

// As llama.cpp's vocabulary loader: a special token id outside the vocabulary is ignored (the
// default stays: SentencePiece's BOS 1 / EOS 2 / UNK 0, none for gpt2), 0xFFFFFFFF being "none".
TEST(GgufVocab, SpecialIdsOutsideTheVocabularyAreIgnored) {
  const test::TempDir dir;
  const auto encode = [&](GgufWriter w, const std::function<void(GgufWriter&)>& edit) {
    edit(w);
    w.write(dir.file("t.gguf"));
    const Tokenizer t = Tokenizer::load(dir.file("t.gguf"));
    return std::make_pair(t.encode("ab a"), t.bos_id());
  };
  using W = GgufWriter&;
  const auto llama = encode(tiny_llama(), [](W) {});
  EXPECT_EQ(encode(tiny_llama(), [](W w) { w.set_u32("tokenizer.ggml.bos_token_id", 264); }), llama);
  EXPECT_EQ(encode(tiny_llama(), [](W w) {
              w.set_u32("tokenizer.ggml.unknown_token_id", 99999);
              w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFF);
              w.set_u32("tokenizer.ggml.eos_token_id", 0xFFFFFFFF);
            }),
            llama);
  const auto gpt2 = encode(tiny_gpt2(), [](W) {});
  EXPECT_EQ(encode(tiny_gpt2(), [](W w) {
              w.set_u32("tokenizer.ggml.eos_token_id", 1000);
              w.set_u32("tokenizer.ggml.padding_token_id", 258);
            }),
            gpt2);
}

TEST(GgufVocab, MalformedVocabulariesNameTheKey) {
  const test::TempDir dir;
  const std::string path = dir.file("bad.gguf");
  // Loading `w` with `edit` applied fails with a message holding each of `parts`.
  const auto expect_error = [&](GgufWriter w, const std::function<void(GgufWriter&)>& edit,
                                std::initializer_list<const char*> parts) {
    edit(w);
    w.write(path);
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  using W = GgufWriter&;
  expect_error({}, [](W w) { w.set_string("general.architecture", "llama"); },
               {"bad.gguf", "tokenizer.ggml.model", "missing"});
  expect_error({}, [](W w) { w.set_string("tokenizer.ggml.model", "bert"); },
               {"tokenizer.ggml.model", "'bert'", "llama", "gpt2"});
  expect_error({}, [](W w) { w.set_u32("tokenizer.ggml.model", 1); }, {"tokenizer.ggml.model", "string"});
  expect_error({}, [](W w) { w.set_string("tokenizer.ggml.model", "llama"); }, {"tokenizer.ggml.tokens", "missing"});
  expect_error(tiny_gpt2(), [](W w) { w.set_string("tokenizer.ggml.pre", "tiktoken-9"); },
               {"tokenizer.ggml.pre", "'tiktoken-9'", "llama-bpe", "qwen2", "gpt-2", "default"});
  expect_error(tiny_llama(), [](W w) { w.set_f32s("tokenizer.ggml.scores", {0.0f, 1.0f}); },
               {"tokenizer.ggml.scores", "2 entries", "264"});
  expect_error(tiny_llama(), [](W w) { w.set_i32s("tokenizer.ggml.token_type", {1, 1, 1}); },
               {"tokenizer.ggml.token_type", "3 entries", "264"});
  expect_error(tiny_gpt2(), [](W w) {
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFF);
  }, {"BOS is to be added", "'tokenizer.ggml.bos_token_id' is missing or outside the vocabulary"});
  expect_error(tiny_gpt2(), [](W w) { w.set_string("tokenizer.ggml.add_bos_token", "yes"); },
               {"tokenizer.ggml.add_bos_token", "bool"});
  expect_error(tiny_gpt2(), [](W w) { w.set_bool("tokenizer.ggml.add_bos_token", true); },
               {"BOS", "tokenizer.ggml.bos_token_id"});
  expect_error(tiny_llama(), [](W w) { w.set_i32s("tokenizer.ggml.scores", std::vector<std::int32_t>(264, 0)); },
               {"tokenizer.ggml.scores", "float"});
  expect_error({}, [](W w) {
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_strings("tokenizer.ggml.tokens", {"<unk>", "a"});
  }, {"tokenizer.ggml.scores", "missing"});
  expect_error({}, [](W w) {
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_strings("tokenizer.ggml.tokens", {"a", "b"});
  }, {"tokenizer.ggml.merges", "missing"});
  expect_error(tiny_gpt2(), [](W w) { w.set_strings("tokenizer.ggml.merges", {"\xC4\xA0 a", "ab"}); },
               {"'tokenizer.ggml.merges'[1]", "'ab'"});
  expect_error(tiny_gpt2(), [](W w) { w.set_strings("tokenizer.ggml.merges", {"a zz"}); },
               {"tokenizer.ggml.merges", "'zz' is not in the vocabulary"});
  expect_error(tiny_gpt2(), [](W w) { w.set_strings("tokenizer.ggml.tokens", {"a", "b", "a"}); },
               {"tokenizer.ggml.tokens", "'a'", "[0]", "[2]"});
  std::vector<std::int32_t> types(264, 1);
  types[7] = 9;
  expect_error(tiny_llama(), [&](W w) { w.set_i32s("tokenizer.ggml.token_type", types); },
               {"'tokenizer.ggml.token_type'[7] = 9"});
  // SentencePiece's own checks: byte tokens must cover all 256 bytes.
  types.assign(264, 1);
  types[0] = 2;
  types[3] = 6;
  expect_error(tiny_llama(), [&](W w) { w.set_i32s("tokenizer.ggml.token_type", types); },
               {"bad.gguf", "tokenizer.ggml.tokens/scores/token_type", "256 byte pieces"});
  expect_error(tiny_gpt2(), [](W w) { w.set_strings("tokenizer.ggml.tokens", {}); }, {"tokenizer.ggml.tokens", "empty"});
}

// Control tokens SentencePiece's BPE would produce for text (its Encode then fails with "Internal: ... all
// normalized characters are not consumed", issue 29): refused at load, naming the file and the key. Control
// tokens of several characters (<s>, </s>, <|im_end|>) stay accepted.
TEST(GgufVocab, ControlTokensSentencePieceWouldProduceAreRefusedAtLoad) {
  const test::TempDir dir;
  const auto load_error = [&](const std::vector<std::int32_t>& types, const std::string& name) -> std::string {
    with(tiny_llama(), [&](GgufWriter& w) { w.set_i32s("tokenizer.ggml.token_type", types); }).write(dir.file(name));
    try {
      const Tokenizer t = Tokenizer::load(dir.file(name));
      t.encode("ab a");  // what failed before, with SentencePiece's message and no file named
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string all = load_error(std::vector<std::int32_t>(264, 3), "all_control.gguf");
  for (const char* part : {"all_control.gguf", "tokenizer.ggml.token_type", "control token", "no token is a normal one"})
    EXPECT_NE(all.find(part), std::string::npos) << all;
  EXPECT_EQ(all.find("Internal"), std::string::npos) << all;
  std::vector<std::int32_t> types(264, 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  std::fill(types.begin() + 3, types.begin() + 259, 6);
  EXPECT_EQ(load_error(types, "ok.gguf"), "");
  types[260] = 3;  // "a"
  const std::string one = load_error(types, "one_char.gguf");
  for (const char* part : {"one_char.gguf", "tokenizer.ggml.token_type", "token 260 'a'", "of one character"})
    EXPECT_NE(one.find(part), std::string::npos) << one;
  types[260] = 1;
  types[262] = 3;  // "▁a" is also the BPE merge "▁" + "a": allowed alone (nothing merges into a control piece)
  EXPECT_EQ(load_error(types, "merge.gguf"), "");
}

// A SentencePiece error while encoding (here from a tokenizer.model whose one-character control piece "▁", the
// space SentencePiece puts before the text, the GGUF check would refuse) names the model it comes from.
TEST(GgufVocab, SentencePieceEncodeErrorsNameTheModel) {
  const auto field = [](int number, int wire, const std::string& payload) {
    std::string out(1, static_cast<char>(number << 3 | wire));
    if (wire == 2) out += static_cast<char>(payload.size());
    return out + payload;
  };
  const auto piece = [&](const std::string& text, int type) {
    return field(1, 2, field(1, 2, text) + field(2, 5, std::string(4, '\0')) + field(3, 0, std::string(1, static_cast<char>(type))));
  };
  const std::string proto = piece("<unk>", 2) + piece("\xE2\x96\x81", 3) + piece("b", 1) + field(2, 2, field(3, 0, "\x02"));
  const Tokenizer t(load_sentencepiece_proto(proto, "m/tokenizer.model", {}, "test"));
  try {
    t.encode("b");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m/tokenizer.model: SentencePiece cannot encode"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace woq
