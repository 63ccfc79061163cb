#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>

#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/json_members.h"
#include "tokenizer/unicode.h"

namespace woq {

using hf::Json;
using hf::Piece;

// Byte trie of added-token patterns, for leftmost-longest matching.
class HfTokenizer::Trie {
 public:
  void add(std::string_view s, std::size_t index) {
    if (s.empty()) return;
    std::size_t node = 0;
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      auto& next = nodes_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == u; });
      if (it == next.end()) {
        next.emplace_back(u, nodes_.size());
        node = nodes_.size();
        nodes_.emplace_back();
      } else {
        node = it->second;
      }
    }
    nodes_[node].value = static_cast<std::int64_t>(index);
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  bool may_start(char c) const { return first_[static_cast<unsigned char>(c)]; }
  /// The longest pattern `s` has at `pos`: (index, length), or (-1, 0).
  std::pair<std::int64_t, std::size_t> longest_at(std::string_view s, std::size_t pos) const {
    std::pair<std::int64_t, std::size_t> best{-1, 0};
    std::size_t node = 0;
    for (std::size_t i = pos; i < s.size(); ++i) {
      const auto u = static_cast<unsigned char>(s[i]);
      const auto& next = nodes_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == u; });
      if (it == next.end()) break;
      node = it->second;
      if (nodes_[node].value >= 0) best = {nodes_[node].value, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::size_t>> next;
    std::int64_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

HfTokenizer::HfTokenizer(HfTokenizerParts parts, const std::string& source)
    : parts_(std::move(parts)), source_(source) {
  if (!parts_.model) fail("{}: no model", source);
  raw_trie_ = std::make_unique<Trie>();
  normalized_trie_ = std::make_unique<Trie>();
  vocab_size_ = parts_.model->id_limit();
  std::size_t added_bytes = 0;
  for (std::size_t i = 0; i < parts_.added.size(); ++i) {
    const AddedToken& t = parts_.added[i];
    if (t.content.empty()) fail("{}: added_tokens[{}] has an empty content", source, i);
    if (t.id < 0) fail("{}: added_tokens[{}] ('{}') has the negative id {}", source, i, printable(t.content), t.id);
    if (!unicode::is_valid_utf8(t.content)) fail("{}: added_tokens[{}] is not valid UTF-8", source, i);
    if (const std::string* own = parts_.model->token(t.id); own != nullptr && *own != t.content)
      fail("{}: added_tokens[{}] ('{}') has id {}, which the vocabulary gives to '{}'", source, i,
           printable(t.content), t.id, printable(*own));
    if (const auto it = added_by_id_.find(t.id); it != added_by_id_.end())
      fail("{}: added_tokens[{}] ('{}') has id {}, as does '{}'", source, i, printable(t.content), t.id,
           printable(parts_.added[it->second].content));
    if (!added_ids_.emplace(t.content, t.id).second)
      fail("{}: added_tokens[{}]: '{}' is given twice", source, i, printable(t.content));
    added_by_id_.emplace(t.id, i);
    std::string pattern = t.content;
    if (t.content.size() > kMaxAddedTokenBytes)
      fail("{}: added_tokens[{}] is {} bytes long; woq accepts at most {}", source, i, t.content.size(), kMaxAddedTokenBytes);
    added_bytes += t.content.size();
    if (added_bytes > kMaxAddedBytes) fail("{}: added_tokens hold more than {} bytes", source, kMaxAddedBytes);
    if (t.id > kMaxTokenId) fail("{}: added_tokens[{}] has id {}, more than the {} woq accepts", source, i, t.id, kMaxTokenId);
    if (t.normalized && parts_.normalizer)
      pattern = parts_.normalizer->normalize(pattern, hf::normalized_limit(pattern.size()));
    (t.normalized ? *normalized_trie_ : *raw_trie_).add(pattern, i);
    added_patterns_.push_back(std::move(pattern));
    vocab_size_ = std::max<std::int64_t>(vocab_size_, t.id + std::int64_t{1});
  }
  for (const std::int32_t id : parts_.specials.prefix)
    if (id < 0 || id >= vocab_size_) fail("{}: post_processor names token id {}, outside the vocabulary", source, id);
  for (const std::int32_t id : parts_.specials.suffix)
    if (id < 0 || id >= vocab_size_) fail("{}: post_processor names token id {}, outside the vocabulary", source, id);
  // Composing normalizers can shrink the input (3 code points of Hangul jamo -> 1 syllable).
  const std::int64_t shrink = parts_.normalizer ? 3 : 1;
  for (std::int64_t id = 0; id < vocab_size_; ++id)
    max_token_bytes_ =
        std::max(max_token_bytes_, shrink * static_cast<std::int64_t>(token_text(static_cast<std::int32_t>(id)).size()));
}

HfTokenizer::~HfTokenizer() = default;

namespace {

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) --i;
  return unicode::is_word(unicode::next_code_point(s, i));
}

bool starts_with_word(std::string_view s) {
  std::size_t i = 0;
  return !s.empty() && unicode::is_word(unicode::next_code_point(s, i));
}

// Where the whitespace at the end of s begins (scanning back from the end).
std::size_t trailing_space_start(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t lead = end - 1;
    while (lead > 0 && (static_cast<unsigned char>(s[lead]) & 0xc0) == 0x80) --lead;
    std::size_t i = lead;
    if (!unicode::is_whitespace(unicode::next_code_point(s, i))) break;
    end = lead;
  }
  return end;
}

// Bytes of whitespace at the start of s.
std::size_t leading_space(std::string_view s) {
  std::size_t end = 0;
  for (std::size_t i = 0; i < s.size() && unicode::is_whitespace(unicode::next_code_point(s, i));) end = i;
  return end;
}

}  // namespace

void HfTokenizer::split_added(std::vector<Piece>& pieces, const Trie& trie) const {
  if (trie.empty()) return;
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const std::string_view s = p.text;
    std::size_t done = 0;  // text before this is already in `out`
    for (std::size_t pos = 0; pos < s.size();) {
      if (!trie.may_start(s[pos])) {
        ++pos;
        continue;
      }
      const auto [index, length] = trie.longest_at(s, pos);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = parts_.added[static_cast<std::size_t>(index)];
      std::size_t start = pos, stop = pos + length;
      pos = stop;
      if (t.single_word && ((start > 0 && ends_with_word(s.substr(0, start))) || starts_with_word(s.substr(stop))))
        continue;
      if (t.lstrip) start = done + trailing_space_start(s.substr(done, start - done));
      if (t.rstrip) stop += leading_space(s.substr(stop));
      if (done < start) out.push_back({std::string(s.substr(done, start - done)), p.first && done == 0, -1});
      out.push_back({std::string(s.substr(start, stop - start)), false, t.id});
      done = stop;
      pos = std::max(pos, stop);
    }
    if (done == 0) {
      out.push_back(std::move(p));
    } else if (done < s.size()) {
      out.push_back({std::string(s.substr(done)), false, -1});
    }
  }
  pieces = std::move(out);
}

std::vector<std::int32_t> HfTokenizer::encode(std::string_view text) const {
  try {
    return encode_pieces(text);
  } catch (const Error& e) {
    // A normalizer's growth names no file; a regex's budget names the file and field already.
    if (std::string_view(e.what()).starts_with(source_)) throw;
    fail("{}: {}", source_, e.what());
  }
}

std::vector<std::int32_t> HfTokenizer::encode_pieces(std::string_view text) const {
  std::vector<Piece> pieces;
  pieces.push_back({unicode::to_valid_utf8(text), true, -1});
  split_added(pieces, *raw_trie_);
  if (parts_.normalizer)
    for (Piece& p : pieces)
      if (p.id < 0) p.text = parts_.normalizer->normalize(std::move(p.text), hf::normalized_limit(text.size()));
  split_added(pieces, *normalized_trie_);
  if (parts_.pre_tokenizer) parts_.pre_tokenizer->apply(pieces);
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const Piece& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      parts_.model->encode(p.text, ids);
    }
  }
  return ids;
}

std::string HfTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const std::int32_t id : ids) {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (!parts_.added[it->second].special) tokens.push_back(added_patterns_[it->second]);
    } else if (const std::string* t = parts_.model->token(id)) {
      tokens.push_back(*t);
    }
  }
  std::string text;
  if (parts_.decoder) {
    parts_.decoder->decode(tokens, false);
    for (const std::string& t : tokens) text += t;
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i > 0 ? " " : "") + tokens[i];
  }
  return unicode::to_valid_utf8(text);
}

std::string HfTokenizer::token_text(std::int32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return parts_.added[it->second].content;
  const std::string* t = parts_.model->token(id);
  if (t == nullptr) return {};
  if (!parts_.decoder) return *t;
  std::vector<std::string> tokens{*t};
  parts_.decoder->decode(tokens, true);
  std::string text;
  for (const std::string& s : tokens) text += s;
  return text;
}

std::optional<std::int32_t> HfTokenizer::token_id(std::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  return parts_.model->id(token);
}

namespace {

// A token of `parts` given by its text: added tokens first, then the vocabulary.
std::optional<std::int32_t> find_token(const HfTokenizerParts& parts, std::string_view text) {
  for (const AddedToken& t : parts.added)
    if (t.content == text) return t.id;
  return parts.model->id(text);
}

// Adds the special tokens tokenizer.json's post_processor `j` puts around one sequence.
void post_processor(const Json& j, const std::string& where, const HfTokenizerParts& parts, SpecialTokens& s,
                    int depth = 0) {
  if (j.is_null()) return;
  const std::string type = hf::type_of(j, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    if (depth >= hf::kMaxSequenceDepth) hf::bad(where, fmt::format("Sequences nest more than {} deep", hf::kMaxSequenceDepth));
    const Json& list = hf::array_member(j, "processors", where);
    for (std::size_t i = 0; i < list.size(); ++i)
      post_processor(list[i], fmt::format("{}.processors[{}]", where, i), parts, s, depth + 1);
    return;
  }
  std::vector<std::int32_t> before, after;
  if (type == "TemplateProcessing") {
    const Json& single = hf::array_member(j, "single", where);
    const Json& specials = hf::member(j, "special_tokens", where);
    bool seen_sequence = false;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string w = fmt::format("{}.single[{}]", where, i);
      const Json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        if (seen_sequence) hf::bad(w, "a single-sequence template holds the sequence only once");
        seen_sequence = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken"))
        hf::bad(w, fmt::format("must be {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}, got {}", describe_json(item)));
      const std::string name = hf::string_member(item["SpecialToken"], "id", w + ".SpecialToken");
      if (!specials.is_object() || !specials.contains(name))
        hf::bad(where, fmt::format("special_tokens has no entry '{}' (used by single[{}])", printable(name), i));
      const Json& ids = hf::array_member(specials[name], "ids", fmt::format("{}.special_tokens.{}", where, printable(name)));
      if (ids.size() > 16) hf::bad(where, fmt::format("special_tokens.{}.ids holds {} ids; woq accepts at most 16", printable(name), ids.size()));
      for (const Json& id : ids) {
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX)
          hf::bad(where, fmt::format("special_tokens.{}.ids holds {}, not a token id", printable(name), describe_json(id)));
        (seen_sequence ? after : before).push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
      }
    }
    if (!seen_sequence) hf::bad(where + ".single", "has no {\"Sequence\": ...} item");
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const Json& pair = hf::member(j, key, where);
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string())
        hf::bad(where, fmt::format("'{}' must be [token, id], got {}", key, describe_json(pair)));
      const auto id = find_token(parts, pair[0].get<std::string>());
      if (!id) hf::bad(where, fmt::format("'{}' names '{}', which is not a token", key, printable(pair[0].get<std::string>())));
      (std::string_view(key) == "cls" ? before : after).push_back(*id);
    }
  } else {
    hf::bad(where, fmt::format("post_processor type '{}' is not supported (woq has TemplateProcessing, ByteLevel, "
                               "BertProcessing, RobertaProcessing, Sequence)",
                               printable(type)));
  }
  s.prefix.insert(s.prefix.begin(), before.begin(), before.end());
  s.suffix.insert(s.suffix.end(), after.begin(), after.end());
}

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}
// (null or absent: none). Throws woq::Error naming the field for other types.
std::string config_token(const Json& config, const char* key) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return {};
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  fail("tokenizer_config.json: field '{}' must be a string or {{\"content\": string}}, got {}", key, describe_json(v));
}

// tokenizer_config.json's boolean `key`, `fallback` when absent or null.
bool config_flag(const Json& config, const char* key, bool fallback) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_boolean())
    fail("tokenizer_config.json: field '{}' must be true or false, got {}", key, describe_json(config[key]));
  return config[key].get<bool>();
}

// BOS/EOS named by tokenizer_config.json, and LlamaTokenizerFast's rewrite
// of the post-processor from add_bos_token / add_eos_token.
void apply_config(const Json& config, HfTokenizerParts& parts) {
  SpecialTokens& s = parts.specials;
  auto resolve = [&](const char* key) -> std::int32_t {
    const std::string text = config_token(config, key);
    const auto id = text.empty() ? std::nullopt : find_token(parts, text);
    return id ? *id : -1;
  };
  s.bos = resolve("bos_token");
  s.eos = resolve("eos_token");
  if (s.bos < 0 && s.prefix.size() == 1) s.bos = s.prefix[0];
  if (!config.is_object()) return;
  const std::string cls = config_token(config, "tokenizer_class");
  static constexpr std::array<std::string_view, 6> kLlamaLike = {"LlamaTokenizer",     "LlamaTokenizerFast",
                                                                 "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                                                                 "GemmaTokenizer",     "GemmaTokenizerFast"};
  if (std::find(kLlamaLike.begin(), kLlamaLike.end(), cls) == kLlamaLike.end()) return;
  if (!config.contains("add_bos_token") && !config.contains("add_eos_token")) return;
  s.prefix.clear();
  s.suffix.clear();
  if (config_flag(config, "add_bos_token", true) && s.bos >= 0) s.prefix.push_back(s.bos);
  if (config_flag(config, "add_eos_token", false) && s.eos >= 0) s.suffix.push_back(s.eos);
}

std::int32_t id_value(const Json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > kMaxTokenId)
    hf::bad(where, fmt::format("must be a token id (an integer in [0, {}]), got {}", kMaxTokenId, describe_json(v)));
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

std::vector<std::pair<std::string, std::int32_t>> vocab_entries(const Json& vocab, const std::string& where) {
  if (!vocab.is_object()) hf::bad(where, fmt::format("must be an object of token -> id, got {}", describe_json(vocab)));
  std::vector<std::pair<std::string, std::int32_t>> out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) out.emplace_back(token, id_value(id, fmt::format("{} '{}'", where, printable(token))));
  if (out.empty()) hf::bad(where, "is empty");
  return out;
}

// "a b" (split on the one space) as tokenizers' convert_merges_to_hashmap.
std::pair<std::string, std::string> split_merge(std::string_view line, const std::string& where) {
  const std::size_t sp = line.find(' ');
  if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
    hf::bad(where, fmt::format("'{}' is not two tokens separated by one space", printable(line)));
  return {std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))};
}

AddedToken added_token(const Json& a, const std::string& where) {
  AddedToken t;
  t.content = hf::string_member(a, "content", where);
  t.id = id_value(hf::member(a, "id", where), where + ".id");
  t.single_word = hf::bool_member(a, "single_word", false, where);
  t.lstrip = hf::bool_member(a, "lstrip", false, where);
  t.rstrip = hf::bool_member(a, "rstrip", false, where);
  t.special = hf::bool_member(a, "special", false, where);
  t.normalized = hf::bool_member(a, "normalized", !t.special, where);
  return t;
}

}  // namespace

std::unique_ptr<TokenizerBackend> load_tokenizer_json(const std::string& path, const Json& config) {
  const Json j = read_json_file(path);
  if (!j.is_object()) hf::bad(path, fmt::format("expected a JSON object, got {}", describe_json(j)));
  const Json& model = hf::member(j, "model", path);
  const std::string mw = path + ": model";
  const std::string type = model.is_object() && model.contains("type") ? hf::type_of(model, mw) : "BPE";
  if (type != "BPE")
    hf::bad(mw, fmt::format("type '{}' is not supported (woq reads BPE tokenizers; Unigram and WordPiece are not "
                            "implemented)",
                            printable(type)));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    hf::bad(mw, "'dropout' is set: BPE dropout randomizes encoding and is for training only");
  BpeOptions o;
  if (model.contains("unk_token") && !model["unk_token"].is_null()) o.unk_token = hf::string_member(model, "unk_token", mw);
  o.fuse_unk = hf::bool_member(model, "fuse_unk", false, mw);
  o.byte_fallback = hf::bool_member(model, "byte_fallback", false, mw);
  o.ignore_merges = hf::bool_member(model, "ignore_merges", false, mw);
  if (model.contains("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null())
    o.continuing_subword_prefix = hf::string_member(model, "continuing_subword_prefix", mw);
  if (model.contains("end_of_word_suffix") && !model["end_of_word_suffix"].is_null())
    o.end_of_word_suffix = hf::string_member(model, "end_of_word_suffix", mw);
  const auto vocab = vocab_entries(hf::member(model, "vocab", mw), mw + ".vocab");
  const Json& merges_json = hf::array_member(model, "merges", mw);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (std::size_t i = 0; i < merges_json.size(); ++i) {
    const Json& m = merges_json[i];
    const std::string w = fmt::format("{}.merges[{}]", mw, i);
    if (m.is_string()) {
      merges.push_back(split_merge(m.get_ref<const std::string&>(), w));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      hf::bad(w, fmt::format("must be \"a b\" or [\"a\", \"b\"], got {}", describe_json(m)));
    }
  }
  HfTokenizerParts parts;
  parts.model = std::make_unique<BpeModel>(vocab, merges, std::move(o), path);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const Json& added = hf::array_member(j, "added_tokens", path);
    for (std::size_t i = 0; i < added.size(); ++i)
      parts.added.push_back(added_token(added[i], fmt::format("{}: added_tokens[{}]", path, i)));
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    parts.normalizer = hf::make_normalizer(j["normalizer"], path + ": normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    parts.pre_tokenizer = hf::make_pre_tokenizer(j["pre_tokenizer"], path + ": pre_tokenizer");
  if (j.contains("decoder") && !j["decoder"].is_null()) parts.decoder = hf::make_decoder(j["decoder"], path + ": decoder");
  if (j.contains("post_processor")) post_processor(j["post_processor"], path + ": post_processor", parts, parts.specials);
  apply_config(config, parts);
  parts.description = fmt::format("tokenizer.json BPE ({} tokens, {} added)", vocab.size(), parts.added.size());
  return std::make_unique<HfTokenizer>(std::move(parts), path);
}

std::unique_ptr<TokenizerBackend> load_gpt2_vocab(const std::string& vocab_path, const std::string& merges_path,
                                                  const Json& config) {
  const auto vocab = vocab_entries(read_json_file(vocab_path), vocab_path);
  const std::string text = read_text_file(merges_path, 256ull << 20);
  std::vector<std::pair<std::string, std::string>> merges;
  std::size_t line_no = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    if (line.ends_with('\r')) line.remove_suffix(1);
    ++line_no;
    begin = end + 1;
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    merges.push_back(split_merge(line, fmt::format("{}: line {}", merges_path, line_no)));
  }
  HfTokenizerParts parts;
  parts.model = std::make_unique<BpeModel>(vocab, merges, BpeOptions{}, vocab_path);
  parts.pre_tokenizer = hf::gpt2_pre_tokenizer();
  parts.decoder = hf::gpt2_decoder();
  // The special tokens transformers registers: tokenizer_config.json's, or GPT-2's <|endoftext|>.
  std::vector<std::string> specials;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (const std::string t = config_token(config, key); !t.empty()) specials.push_back(t);
  if (!config.is_object()) specials.emplace_back("<|endoftext|>");
  for (const std::string& s : specials) {
    const auto id = parts.model->id(s);
    const bool dup = std::any_of(parts.added.begin(), parts.added.end(), [&](const AddedToken& t) { return t.content == s; });
    if (id && !dup) parts.added.push_back({s, *id, false, false, false, false, true});
  }
  apply_config(config, parts);
  if (config_flag(config, "add_bos_token", false) && parts.specials.bos >= 0) parts.specials.prefix = {parts.specials.bos};
  parts.description = fmt::format("GPT-2 vocab.json + merges.txt BPE ({} tokens)", vocab.size());
  return std::make_unique<HfTokenizer>(std::move(parts), vocab_path);
}

}  // namespace woq
