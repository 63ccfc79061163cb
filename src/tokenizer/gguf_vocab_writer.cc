#include "tokenizer/gguf_vocab_writer.h"

#include <sentencepiece_processor.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chat_template_file.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer.h"

namespace woq {

namespace {

// llama.cpp's token types (gguf-py TokenType).
enum TokenType : std::int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Text that tells pre-tokenizers apart (as llama.cpp's convert_hf_to_gguf_update.py chktxt does):
// digits of every length, contractions, case, whitespace runs, punctuation, several scripts, emoji.
constexpr std::string_view kProbe =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 "
    "33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL HELLO World ÀÉÎÕÜ ǅungla ﬁnal x²+y³ 1⁄2 Ⅻ";

// Sets the special-token keys every vocabulary has.
void set_specials(GgufWriter& w, const ModelConfig& config, const Tokenizer& tok, std::int64_t unk, std::int64_t pad) {
  if (config.bos_token_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(config.bos_token_id));
  const std::int64_t eos = !config.eos_token_ids.empty() ? config.eos_token_ids.front() : tok.eos_id();
  if (eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(eos));
  // Further stop tokens (Llama 3's <|eom_id|> / <|eot_id|>, Qwen's <|endoftext|>) as llama.cpp's EOM / EOT.
  for (std::size_t i = 1; i < config.eos_token_ids.size() && i < 3; ++i) {
    const auto id = static_cast<std::uint32_t>(config.eos_token_ids[i]);
    const bool eom = tok.token_text(static_cast<std::int32_t>(id)) == "<|eom_id|>";
    const char* key = eom || w.has("tokenizer.ggml.eot_token_id") ? "tokenizer.ggml.eom_token_id" : "tokenizer.ggml.eot_token_id";
    if (!w.has(key)) w.set_u32(key, id);
  }
  if (unk >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<std::uint32_t>(unk));
  if (pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(pad));
  w.set_bool("tokenizer.ggml.add_bos_token", tok.add_bos());
  w.set_bool("tokenizer.ggml.add_eos_token", tok.encode("a", true).back() == tok.eos_id() && tok.eos_id() >= 0);
}

// Pads the vocabulary to the model's rows as llama.cpp does ("[PADi]", unused).
void pad_to(std::vector<std::string>& tokens, std::vector<std::int32_t>& types, std::vector<float>* scores,
            const ModelConfig& config, const std::string& from) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n > config.vocab_size)
    fail("{}: {} tokens, more than config.json vocab_size {} (the embedding's rows)", from, n, config.vocab_size);
  for (std::int64_t i = n; i < config.vocab_size; ++i) {
    tokens.push_back(fmt::format("[PAD{}]", i));
    types.push_back(kUnused);
    if (scores != nullptr) scores->push_back(-1000.0f);
  }
}

// tokenizer.model -> "llama" (convert_hf_to_gguf.py _create_vocab_sentencepiece).
void write_sentencepiece(const std::string& dir, const std::string& path, const ModelConfig& config, GgufWriter& w,
                         std::vector<std::string>& notes) {
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(path); !status.ok()) fail("{}: not a SentencePiece model: {}", path, status.ToString());
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    tokens.push_back(sp.IdToPiece(id));
    scores.push_back(sp.GetScore(id));
    types.push_back(sp.IsUnknown(id) ? kUnknown : sp.IsControl(id) ? kControl : sp.IsUnused(id) ? kUnused
                    : sp.IsByte(id) ? kByte : kNormal);
  }
  pad_to(tokens, types, &scores, config, path);
  std::vector<std::string> pieces;
  if (const auto status = sp.Encode("a", &pieces); !status.ok()) fail("{}: cannot encode: {}", path, status.ToString());
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_f32s("tokenizer.ggml.scores", scores);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_bool("tokenizer.ggml.add_space_prefix", !pieces.empty() && pieces.front().starts_with("\xE2\x96\x81"));
  set_specials(w, config, Tokenizer::load(dir), sp.unk_id(), sp.pad_id());
  std::vector<int> one, two;
  if (sp.Encode("a b", &one).ok() && sp.Encode("a  b", &two).ok() && one == two)
    notes.push_back(fmt::format("{} collapses runs of spaces (SentencePiece remove_extra_whitespaces); a GGUF llama "
                                "vocabulary cannot say so, so the GGUF file (in llama.cpp and in woq alike) tokenizes "
                                "text with repeated spaces differently from this tokenizer.model", path));
}

// Whether `j` (a pre_tokenizer or decoder) is or contains ByteLevel.
bool has_byte_level(const nlohmann::json& j) {
  if (!j.is_object()) return false;
  if (j.value("type", "") == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders"})
    if (j.contains(list) && j[list].is_array())
      for (const auto& e : j[list])
        if (has_byte_level(e)) return true;
  return false;
}

// A byte-level BPE tokenizer.json -> "gpt2", with the tokenizer.ggml.pre
// under which woq's GGUF reader tokenizes a probe text exactly as the
// tokenizer.json does (the idea of llama.cpp's pre-tokenizer hash).
void write_byte_level_bpe(const std::string& dir, const std::string& path, const ModelConfig& config, GgufWriter& w) {
  const nlohmann::json j = read_json_file(path);
  const auto& model = j.contains("model") ? j["model"] : nlohmann::json();
  if (!model.is_object() || model.value("type", "BPE") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
    fail("{}: only BPE tokenizer.json files can be written as a GGUF vocabulary", path);
  if (!has_byte_level(j.value("pre_tokenizer", nlohmann::json())) && !has_byte_level(j.value("decoder", nlohmann::json())))
    fail("{}: a SentencePiece-style BPE tokenizer.json without tokenizer.model; woq writes GGUF vocabularies "
         "from tokenizer.model (llama) or a byte-level tokenizer.json (gpt2)", path);
  std::map<std::int64_t, std::pair<std::string, std::int32_t>> by_id;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0) fail("{}: model.vocab['{}'] is not an id", path, printable(token));
    by_id[id.get<std::int64_t>()] = {token, kNormal};
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        fail("{}: added_tokens holds an entry without an integer id and a string content", path);
      by_id[t["id"].get<std::int64_t>()] = {t["content"].get<std::string>(), t.value("special", false) ? kControl : kUserDefined};
    }
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  for (const auto& [id, entry] : by_id) {
    while (static_cast<std::int64_t>(tokens.size()) < id) {
      tokens.push_back(fmt::format("[PAD{}]", tokens.size()));
      types.push_back(kUnused);
    }
    tokens.push_back(entry.first);
    types.push_back(entry.second);
  }
  pad_to(tokens, types, nullptr, config, path);
  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array())
    for (const auto& m : model["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        fail("{}: model.merges holds an entry that is neither \"a b\" nor [\"a\", \"b\"]", path);
      }
    }
  const Tokenizer reference = Tokenizer::load(dir);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", merges);
  set_specials(w, config, reference, -1, -1);

  // Try each pre-tokenizer woq reads, most likely first, on a vocabulary-only file.
  std::vector<std::string_view> candidates = gguf_pre_tokenizers();
  const std::string_view first = config.architecture.starts_with("Qwen") ? "qwen2" : "llama-bpe";
  std::stable_partition(candidates.begin(), candidates.end(), [&](std::string_view c) { return c == first; });
  const std::vector<std::int32_t> want = reference.encode(kProbe, false);
  const std::string probe_path =
      (std::filesystem::temp_directory_path() / fmt::format("woq-vocab-probe-{}.gguf", ::getpid())).string();
  struct Remove {
    std::string p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove{probe_path};
  for (const std::string_view pre : candidates) {
    w.set_string("tokenizer.ggml.pre", pre);
    w.write(probe_path);
    try {
      if (Tokenizer(load_gguf_vocab(probe_path)).encode(kProbe, false) == want) return;
    } catch (const Error&) {
      // a pre-tokenizer that cannot hold this vocabulary is simply not the match
    }
  }
  fail("{}: no GGUF pre-tokenizer woq knows ({}) splits text as this tokenizer.json does; llama.cpp would need a "
       "new tokenizer.ggml.pre for it", path, fmt::join(gguf_pre_tokenizers(), ", "));
}

}  // namespace

std::vector<std::string> write_gguf_vocab(const std::string& model, const ModelConfig& config, GgufWriter& w) {
  namespace fs = std::filesystem;
  std::vector<std::string> notes;
  if (is_gguf_path(model)) {
    const GgufFile g(gguf_split_paths(model).front());
    for (const auto& [key, value] : g.metadata())
      if (key.starts_with("tokenizer.")) w.set_value(key, value);
    return notes;
  }
  // As convert_hf_to_gguf.py: tokenizer.model first, then tokenizer.json.
  const std::string spm = (fs::path(model) / "tokenizer.model").string();
  const std::string json = (fs::path(model) / "tokenizer.json").string();
  if (fs::exists(spm)) {
    write_sentencepiece(model, spm, config, w, notes);
  } else if (fs::exists(json)) {
    write_byte_level_bpe(model, json, config, w);
  } else {
    fail("{}: no tokenizer.model or tokenizer.json to write into the GGUF file", model);
  }
  if (const ChatTemplateFile t = read_chat_template_file(model); !t.source.empty())
    w.set_string("tokenizer.chat_template", t.source);
  return notes;
}

}  // namespace woq
