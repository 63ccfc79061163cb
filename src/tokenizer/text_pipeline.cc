#include "tokenizer/text_pipeline.h"

#include <array>

#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/json_members.h"
#include "core/regex.h"
#include "tokenizer/unicode.h"

namespace woq::hf {

namespace {

// A one-character string field (Metaspace's replacement, Strip's content).
std::string char_member(const Json& j, const char* key, const std::string& where) {
  const std::string s = string_member(j, key, where);
  std::size_t i = 0;
  if (s.empty() || !unicode::is_valid_utf8(s) || (unicode::next_code_point(s, i), i != s.size()))
    bad(where, fmt::format("'{}' must be one character, got '{}'", key, printable(s)));
  return s;
}

// {"String": "..."} or {"Regex": "..."}.
Regex pattern_member(const Json& j, const std::string& where) {
  const Json& p = member(j, "pattern", where);
  const std::string w = where + ".pattern";
  if (p.is_object() && p.size() == 1 && p.contains("String") && p["String"].is_string())
    return Regex::literal(p["String"].get<std::string>());
  if (p.is_object() && p.size() == 1 && p.contains("Regex") && p["Regex"].is_string()) {
    try {
      return Regex(p["Regex"].get<std::string>(), w);
    } catch (const Error& e) {
      bad(w, e.what());
    }
  }
  bad(w, fmt::format("must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", describe_json(p)));
}

// ---- splitting pieces (tokenizers' NormalizedString::split) ----

struct Segment {
  std::size_t begin, end;
  bool match;
};

// Segments covering `text`: regex matches and the text between them.
std::vector<Segment> regex_segments(const Regex& re, const std::string& text) {
  std::vector<Segment> segs;
  std::size_t prev = 0;
  for (const auto& [b, e] : re.find_all(text)) {
    if (prev != b) segs.push_back({prev, b, false});
    segs.push_back({b, e, true});
    prev = e;
  }
  if (prev != text.size()) segs.push_back({prev, text.size(), false});
  return segs;
}

// Segments covering `text`: each character for which pred holds, and the runs between.
template <typename Pred>
std::vector<Segment> char_segments(const std::string& text, Pred pred) {
  std::vector<Segment> segs;
  std::size_t last = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t b = i;
    const char32_t c = unicode::next_code_point(text, i);
    if (!pred(c)) continue;
    if (last < b) segs.push_back({last, b, false});
    segs.push_back({b, i, true});
    last = i;
  }
  if (last < text.size()) segs.push_back({last, text.size(), false});
  return segs;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_member(const Json& j, const std::string& where) {
  const std::string b = string_member(j, "behavior", where);
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  bad(where, fmt::format("'behavior' is '{}'; expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                         "Contiguous",
                         printable(b)));
}

// Appends the parts of `p` that `segs` and `behavior` make, empty ones dropped.
void split_piece(Piece&& p, const std::vector<Segment>& segs, Behavior behavior, std::vector<Piece>& out) {
  struct Part {
    std::size_t begin, end;
    bool remove;
  };
  std::vector<Part> parts;
  bool previous = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Segment& s : segs) parts.push_back({s.begin, s.end, false});
      break;
    case Behavior::kRemoved:
      for (const Segment& s : segs) parts.push_back({s.begin, s.end, s.match});
      break;
    case Behavior::kContiguous:
      for (const Segment& s : segs) {
        if (s.match == previous && !parts.empty()) parts.back().end = s.end;
        else parts.push_back({s.begin, s.end, false});
        previous = s.match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Segment& s : segs) {
        if (s.match && !previous && !parts.empty()) parts.back().end = s.end;
        else parts.push_back({s.begin, s.end, false});
        previous = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !previous && !parts.empty()) parts.back().begin = it->begin;
        else parts.push_back({it->begin, it->end, false});
        previous = it->match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const Part& part : parts) {
    if (part.remove || part.begin == part.end) continue;
    out.push_back({p.text.substr(part.begin, part.end - part.begin), p.first && part.begin == 0, -1});
  }
}

// A pre-tokenizer that turns each piece into parts independently.
class PieceSplitter : public PreTokenizer {
 public:
  void apply(std::vector<Piece>& pieces) const final {
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (Piece& p : pieces) {
      if (p.id >= 0) {
        out.push_back(std::move(p));
      } else if (!p.text.empty()) {
        split(std::move(p), out);
      }
    }
    std::erase_if(out, [](const Piece& p) { return p.id < 0 && p.text.empty(); });
    pieces = std::move(out);
  }

 protected:
  virtual void split(Piece&& p, std::vector<Piece>& out) const = 0;
};

// ---- normalizers ----

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form form) : form_(form) {}
  std::string normalize(std::string text, std::size_t max_bytes) const override {
    std::string out = unicode::normalize(text, form_);
    if (out.size() > max_bytes) fail("normalizer: the text grew to {} bytes", out.size());
    return out;
  }

 private:
  unicode::Form form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string normalize(std::string text, std::size_t) const override { return unicode::lowercase(text); }
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text, std::size_t max_bytes) const override {
    if (text.empty()) return text;
    if (text.size() + prefix_.size() > max_bytes) fail("normalizer Prepend: the text grew past {} bytes", max_bytes);
    return prefix_ + text;
  }

 private:
  std::string prefix_;
};

// Replaces every match of `re` in `text` by `content`; throws woq::Error past `max_bytes`.
std::string replace_all(const Regex& re, const std::string& text, const std::string& content,
                        std::size_t max_bytes = std::string::npos) {
  std::string out;
  std::size_t prev = 0;
  for (const auto& [b, e] : re.find_all(text)) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
    if (out.size() > max_bytes) fail("normalizer Replace: the text grew past {} bytes", max_bytes);
  }
  out.append(text, prev, std::string::npos);
  return out;
}

class Replace final : public Normalizer, public Decoder {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  std::string normalize(std::string text, std::size_t max_bytes) const override {
    return replace_all(re_, text, content_, max_bytes);
  }
  void decode(std::vector<std::string>& tokens, bool) const override {
    for (std::string& t : tokens) t = replace_all(re_, t, content_);
  }

 private:
  Regex re_;
  std::string content_;
};

class StripWhitespace final : public Normalizer {
 public:
  StripWhitespace(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text, std::size_t) const override {
    std::size_t b = 0, e = text.size();
    if (left_) {
      for (std::size_t i = 0; i < text.size() && unicode::is_whitespace(unicode::next_code_point(text, i));) b = i;
    }
    if (right_) {
      e = b;  // just after the last character that is not whitespace
      for (std::size_t i = b; i < text.size();)
        if (!unicode::is_whitespace(unicode::next_code_point(text, i))) e = i;
    }
    return text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class NormalizerSequence final : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text, std::size_t max_bytes) const override {
    for (const auto& s : steps_) text = s->normalize(std::move(text), max_bytes);
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// ---- pre-tokenizers ----

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string to_byte_level(const std::string& text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (const char c : text) out += byte_level_char(static_cast<unsigned char>(c));
  return out;
}

class ByteLevelPre final : public PieceSplitter {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern) : nullptr) {}

 protected:
  void split(Piece&& p, std::vector<Piece>& out) const override {
    if (add_prefix_space_ && !p.text.starts_with(' ')) p.text = " " + p.text;
    const std::size_t first = out.size();
    if (regex_) {
      const std::vector<Segment> segs = regex_segments(*regex_, p.text);
      split_piece(std::move(p), segs, Behavior::kIsolated, out);
    } else {
      out.push_back(std::move(p));
    }
    for (std::size_t i = first; i < out.size(); ++i) out[i].text = to_byte_level(out[i].text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SplitPre final : public PieceSplitter {
 public:
  SplitPre(Regex re, Behavior behavior, bool invert) : re_(std::move(re)), behavior_(behavior), invert_(invert) {}

 protected:
  void split(Piece&& p, std::vector<Piece>& out) const override {
    std::vector<Segment> segs = regex_segments(re_, p.text);
    if (invert_)
      for (Segment& s : segs) s.match = !s.match;
    split_piece(std::move(p), segs, behavior_, out);
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class DigitsPre final : public PieceSplitter {
 public:
  explicit DigitsPre(bool individual) : individual_(individual) {}

 protected:
  void split(Piece&& p, std::vector<Piece>& out) const override {
    const std::vector<Segment> segs = char_segments(p.text, unicode::is_numeric);
    split_piece(std::move(p), segs, individual_ ? Behavior::kIsolated : Behavior::kContiguous, out);
  }

 private:
  bool individual_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

struct MetaspaceOptions {
  std::string replacement = "\xE2\x96\x81";  // ▁
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};

MetaspaceOptions metaspace_options(const Json& j, const std::string& where) {
  MetaspaceOptions o;
  o.replacement = char_member(j, "replacement", where);
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = string_member(j, "prepend_scheme", where);
    if (s == "always") o.scheme = PrependScheme::kAlways;
    else if (s == "first") o.scheme = PrependScheme::kFirst;
    else if (s == "never") o.scheme = PrependScheme::kNever;
    else bad(where, fmt::format("'prepend_scheme' is '{}'; expected always, first or never", printable(s)));
  }
  if (j.contains("add_prefix_space") && !bool_member(j, "add_prefix_space", true, where)) {
    if (o.scheme != PrependScheme::kNever && j.contains("prepend_scheme") && !j["prepend_scheme"].is_null())
      bad(where, "add_prefix_space false does not match prepend_scheme");
    o.scheme = PrependScheme::kNever;
  }
  o.split = bool_member(j, "split", true, where);
  return o;
}

class MetaspacePre final : public PieceSplitter {
 public:
  explicit MetaspacePre(MetaspaceOptions o) : o_(std::move(o)), replacement_(Regex::literal(o_.replacement)) {}

 protected:
  void split(Piece&& p, std::vector<Piece>& out) const override {
    std::string text;
    for (const char c : p.text) {
      if (c == ' ') text += o_.replacement;
      else text += c;
    }
    const bool prepend = o_.scheme == PrependScheme::kAlways || (o_.scheme == PrependScheme::kFirst && p.first);
    if (prepend && !text.starts_with(o_.replacement)) text = o_.replacement + text;
    p.text = std::move(text);
    if (!o_.split) {
      out.push_back(std::move(p));
      return;
    }
    const std::vector<Segment> segs = regex_segments(replacement_, p.text);
    split_piece(std::move(p), segs, Behavior::kMergedWithNext, out);
  }

 private:
  MetaspaceOptions o_;
  Regex replacement_;
};

class PreTokenizerSequence final : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) s->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// ---- decoders ----

class ByteLevelDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, bool continuation) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      // A token with a character outside the byte alphabet keeps its UTF-8 bytes (tokenizers does the same).
      std::string mapped;
      bool all = unicode::is_valid_utf8(t);
      for (std::size_t i = 0; all && i < t.size();) {
        const int b = byte_level_byte(unicode::next_code_point(t, i));
        if (b < 0) all = false;
        else mapped += static_cast<char>(b);
      }
      bytes += all ? mapped : t;
    }
    // As tokenizers' from_utf8_lossy; a continuation keeps the raw bytes of a partial character.
    tokens.assign(1, continuation ? std::move(bytes) : unicode::to_valid_utf8(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceOptions o) : o_(std::move(o)) {}
  void decode(std::vector<std::string>& tokens, bool continuation) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (std::size_t at = 0; at < t.size();) {
        if (t.compare(at, o_.replacement.size(), o_.replacement) == 0) {
          if (!(i == 0 && !continuation && o_.scheme != PrependScheme::kNever)) out += ' ';
          at += o_.replacement.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  MetaspaceOptions o_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, bool continuation) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (continuation || unicode::is_valid_utf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (std::size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (std::string& t : tokens) {
      const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) && hex(t[4])) {
        bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, bool) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode(std::vector<std::string>& tokens, bool continuation) const override {
    if (continuation) return;
    const std::size_t n = content_.size();
    for (std::string& t : tokens) {
      std::size_t b = 0, e = t.size();
      for (std::size_t k = 0; k < start_ && b + n <= e && t.compare(b, n, content_) == 0; ++k) b += n;
      for (std::size_t k = 0; k < stop_ && e >= b + n && t.compare(e - n, n, content_) == 0; ++k) e -= n;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

class DecoderSequence final : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode(std::vector<std::string>& tokens, bool continuation) const override {
    for (const auto& s : steps_) s->decode(tokens, continuation);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

template <typename T, typename Make>
std::vector<std::unique_ptr<T>> make_list(const Json& j, const char* key, const std::string& where, int depth,
                                          Make make) {
  if (depth >= kMaxSequenceDepth) bad(where, fmt::format("Sequences nest more than {} deep", kMaxSequenceDepth));
  std::vector<std::unique_ptr<T>> steps;
  const Json& list = array_member(j, key, where);
  for (std::size_t i = 0; i < list.size(); ++i)
    steps.push_back(make(list[i], fmt::format("{}.{}[{}]", where, key, i), depth + 1));
  return steps;
}

// Components of `j`, counted through its Sequences (`key`: their list member), up to one past kMaxSteps.
std::size_t count_steps(const Json& j, const char* key, int depth) {
  if (depth > kMaxSequenceDepth || !j.is_object() || !j.contains(key) || !j[key].is_array()) return 1;
  std::size_t n = 0;
  for (const Json& step : j[key])
    if ((n += count_steps(step, key, depth + 1)) > kMaxSteps) break;
  return n;
}

// Each component is a pass over the text: a chain of 100 000 normalizers costs 100 000 passes per input.
void check_step_count(const Json& j, const char* key, const char* what, const std::string& where, int depth) {
  if (depth > 0) return;  // counted once, from the top
  if (const std::size_t n = count_steps(j, key, 0); n > kMaxSteps)
    bad(where, fmt::format("more than {} {} in its Sequences; woq accepts at most {} (each is a pass over the text)",
                           kMaxSteps, what, kMaxSteps));
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where, int depth) {
  check_step_count(j, "normalizers", "normalizers", where, depth);
  const std::string type = type_of(j, where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Prepend") return std::make_unique<Prepend>(string_member(j, "prepend", where));
  if (type == "Replace") return std::make_unique<Replace>(pattern_member(j, where), string_member(j, "content", where));
  if (type == "Strip")
    return std::make_unique<StripWhitespace>(bool_member(j, "strip_left", true, where),
                                             bool_member(j, "strip_right", true, where));
  if (type == "Sequence")
    return std::make_unique<NormalizerSequence>(make_list<Normalizer>(j, "normalizers", where, depth, make_normalizer));
  bad(where, fmt::format("normalizer type '{}' is not supported (woq has NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                         "Replace, Strip, Sequence)",
                         printable(type)));
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where, int depth) {
  check_step_count(j, "pretokenizers", "pre-tokenizers", where, depth);
  const std::string type = type_of(j, where);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(bool_member(j, "add_prefix_space", true, where),
                                          bool_member(j, "use_regex", true, where));
  if (type == "Split") {
    Regex re = pattern_member(j, where);
    const Behavior b = behavior_member(j, where);
    return std::make_unique<SplitPre>(std::move(re), b, bool_member(j, "invert", false, where));
  }
  if (type == "Digits") return std::make_unique<DigitsPre>(bool_member(j, "individual_digits", false, where));
  if (type == "Metaspace") return std::make_unique<MetaspacePre>(metaspace_options(j, where));
  if (type == "Sequence")
    return std::make_unique<PreTokenizerSequence>(
        make_list<PreTokenizer>(j, "pretokenizers", where, depth, make_pre_tokenizer));
  bad(where, fmt::format("pre_tokenizer type '{}' is not supported (woq has ByteLevel, Split, Digits, Metaspace, "
                         "Sequence)",
                         printable(type)));
}

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where, int depth) {
  check_step_count(j, "decoders", "decoders", where, depth);
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(metaspace_options(j, where));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(char_member(j, "content", where), count_member(j, "start", where),
                                          count_member(j, "stop", where));
  if (type == "Replace") return std::make_unique<Replace>(pattern_member(j, where), string_member(j, "content", where));
  if (type == "Sequence") return std::make_unique<DecoderSequence>(make_list<Decoder>(j, "decoders", where, depth, make_decoder));
  bad(where, fmt::format("decoder type '{}' is not supported (woq has ByteLevel, Metaspace, ByteFallback, Fuse, Strip, "
                         "Replace, Sequence)",
                         printable(type)));
}

std::unique_ptr<PreTokenizer> gpt2_pre_tokenizer() { return std::make_unique<ByteLevelPre>(false, true); }
std::unique_ptr<Decoder> gpt2_decoder() { return std::make_unique<ByteLevelDecoder>(); }

namespace {

struct ByteTable {
  std::array<std::string, 256> chars;
  std::array<int, 512> bytes;
  ByteTable() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      const int cp = printable ? b : 256 + extra++;
      chars[static_cast<std::size_t>(b)] = unicode::encode(static_cast<char32_t>(cp));
      bytes[static_cast<std::size_t>(cp)] = b;
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) { return byte_table().chars[b]; }

int byte_level_byte(char32_t c) { return c < 512 ? byte_table().bytes[c] : -1; }

}  // namespace woq::hf
