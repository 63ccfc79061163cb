#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_backend.h"
#include "tokenizer/unicode.h"

namespace woq {

Tokenizer::Tokenizer(std::unique_ptr<TokenizerBackend> backend) : backend_(std::move(backend)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (is_gguf_path(dir)) return Tokenizer(load_gguf_vocab(dir));
  const auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };
  const auto exists = [](const std::string& p) {
    std::error_code ec;
    return fs::exists(p, ec);
  };
  nlohmann::json config;  // null when absent
  if (exists(file("tokenizer_config.json"))) {
    config = read_json_file(file("tokenizer_config.json"));
    if (!config.is_object()) fail("{}: expected a JSON object", file("tokenizer_config.json"));
  }
  if (exists(file("tokenizer.json"))) return Tokenizer(load_tokenizer_json(file("tokenizer.json"), config));
  if (exists(file("tokenizer.model"))) return Tokenizer(load_sentencepiece(file("tokenizer.model"), config));
  if (exists(file("vocab.json")) && exists(file("merges.txt")))
    return Tokenizer(load_gpt2_vocab(file("vocab.json"), file("merges.txt"), config));
  fail("{}: no tokenizer found (woq reads tokenizer.json, SentencePiece tokenizer.model, or GPT-2 vocab.json + "
       "merges.txt)",
       dir);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<std::int32_t> ids = backend_->encode(text);
  if (!add_special) return ids;
  const SpecialTokens& s = backend_->special_tokens();
  ids.insert(ids.begin(), s.prefix.begin(), s.prefix.end());
  ids.insert(ids.end(), s.suffix.begin(), s.suffix.end());
  return ids;
}

std::vector<std::int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<std::int32_t> ids = backend_->encode(text);
  const std::vector<std::int32_t>& prefix = backend_->special_tokens().prefix;
  if (ids.size() < prefix.size() || !std::equal(prefix.begin(), prefix.end(), ids.begin()))
    ids.insert(ids.begin(), prefix.begin(), prefix.end());
  return ids;
}

std::string Tokenizer::token_text(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return fmt::format("<{}?>", id);
  return backend_->token_text(id);
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  std::size_t run = 0;  // start of the current run of ids inside the vocabulary
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i < ids.size() && ids[i] >= 0 && ids[i] < vocab_size()) continue;
    if (run < i) text += backend_->decode(std::span(ids).subspan(run, i - run));
    if (i < ids.size()) text += fmt::format("<{}?>", ids[i]);
    run = i + 1;
  }
  return text;
}

std::int32_t Tokenizer::bos_id() const {
  const SpecialTokens& s = backend_->special_tokens();
  return s.bos >= 0 ? s.bos : s.prefix.empty() ? -1 : s.prefix.front();
}

bool Tokenizer::add_bos() const {
  const SpecialTokens& s = backend_->special_tokens();
  return !s.prefix.empty() && s.prefix.front() == bos_id();
}

std::string TextStream::decode_range(std::size_t begin, std::size_t end) const {
  return tokenizer_.decode(std::vector<std::int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(begin),
                                                     ids_.begin() + static_cast<std::ptrdiff_t>(end)));
}

void TextStream::set_context(const std::vector<std::int32_t>& ids) {
  ids_ = ids;
  read_ = ids_.size();
  prefix_ = read_ > 0 ? read_ - 1 : 0;
}

std::string TextStream::push(std::int32_t id) {
  ids_.push_back(id);
  const std::string before = decode_range(prefix_, read_);
  const std::string text = decode_range(prefix_, ids_.size());
  // An incomplete UTF-8 sequence (or the U+FFFD an incomplete byte sequence
  // decodes to) waits for the next tokens.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool incomplete = unicode::complete_prefix(text) < text.size() || std::string_view(text).ends_with(kReplacement);
  if (incomplete || text.size() <= before.size() || text.compare(0, before.size(), before) != 0) return {};
  prefix_ = read_;
  read_ = ids_.size();
  return text.substr(before.size());
}

std::string TextStream::flush() {
  const std::string before = decode_range(prefix_, read_);
  const std::string text = decode_range(prefix_, ids_.size());
  prefix_ = read_ = ids_.size();
  return text.size() > before.size() && text.compare(0, before.size(), before) == 0 ? text.substr(before.size())
                                                                                      : std::string();
}

}  // namespace woq
