#include "tokenizer/sentencepiece_backend.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "core/error.h"
#include "io/json_file.h"

namespace woq {

namespace {

class SentencePieceBackend final : public TokenizerBackend {
 public:
  /// `load` fills the processor (from a file or a serialized ModelProto); `source` names it in errors.
  template <typename Load>
  SentencePieceBackend(const std::string& source, Load load) : source_(source) {
    const auto status = load(sp_);
    if (!status.ok()) fail("{}: not a SentencePiece model: {}", source, status.ToString());
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      const std::string piece = sp_.IdToPiece(id);
      max_piece_bytes_ = std::max<std::int64_t>(max_piece_bytes_, static_cast<std::int64_t>(piece.size()));
      if (sp_.IsControl(id) && !piece.empty()) control_pieces_.emplace_back(piece, id);
    }
  }

  /// The tokens around a sequence, BOS/EOS, and what describe() says.
  void configure(SpecialTokens specials, std::string description) {
    specials_ = std::move(specials);
    description_ = std::move(description);
  }
  int bos_id() const { return sp_.bos_id(); }
  int eos_id() const { return sp_.eos_id(); }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    auto encode_plain = [&](std::string_view part) {
      if (part.empty()) return;
      std::vector<int> pieces;
      const auto status = sp_.Encode(part, &pieces);
      if (!status.ok()) fail("{}: SentencePiece cannot encode the text: {}", source_, status.ToString());
      ids.insert(ids.end(), pieces.begin(), pieces.end());
    };
    // Control pieces ("<s>", "</s>", ...) in the text become their ids, as transformers' LlamaTokenizer and
    // llama.cpp's parse_special do.
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t best = std::string_view::npos, best_len = 0;
      std::int32_t best_id = -1;
      for (const auto& [p, id] : control_pieces_) {
        const std::size_t at = text.find(p, begin);
        if (at < best || (at == best && p.size() > best_len)) {
          best = at;
          best_len = p.size();
          best_id = id;
        }
      }
      if (best == std::string_view::npos) break;
      encode_plain(text.substr(begin, best - begin));
      ids.push_back(best_id);
      begin = best + best_len;
    }
    encode_plain(text.substr(std::min(begin, text.size())));
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text;
    const std::vector<int> run(ids.begin(), ids.end());
    const auto status = sp_.Decode(run, &text);
    if (!status.ok()) fail("{}: SentencePiece cannot decode: {}", source_, status.ToString());
    return text;
  }

  std::string token_text(std::int32_t id) const override {
    std::string p = sp_.IdToPiece(id);
    if (sp_.IsByte(id) && p.size() == 6 && p.starts_with("<0x"))
      return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
    std::string out;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        i += 2;
      } else {
        out += p[i];
      }
    }
    return out;
  }

  std::int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<std::int32_t> token_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::int64_t max_token_bytes() const override { return max_piece_bytes_; }
  const SpecialTokens& special_tokens() const override { return specials_; }
  std::string describe() const override { return description_; }

 private:
  std::string source_;  ///< the file (and GGUF fields) in errors
  sentencepiece::SentencePieceProcessor sp_;
  SpecialTokens specials_;
  std::string description_;
  std::int64_t max_piece_bytes_ = 1;
  std::vector<std::pair<std::string, std::int32_t>> control_pieces_;  ///< ("<s>", 1), ("</s>", 2), ...
};

}  // namespace

std::unique_ptr<TokenizerBackend> load_sentencepiece(const std::string& path, const nlohmann::json& config) {
  require_regular_file(path, 256ull << 20);
  auto backend = std::make_unique<SentencePieceBackend>(path, [&](auto& sp) { return sp.Load(path); });
  const auto flag = [&](const char* key, bool fallback) {
    if (!config.is_object() || !config.contains(key) || config[key].is_null()) return fallback;
    if (!config[key].is_boolean())
      fail("tokenizer_config.json: field '{}' must be true or false, got {}", key, describe_json(config[key]));
    return config[key].get<bool>();
  };
  SpecialTokens s;
  s.bos = backend->bos_id();
  s.eos = backend->eos_id();
  if (flag("add_bos_token", true) && s.bos >= 0) s.prefix.push_back(s.bos);
  if (flag("add_eos_token", false) && s.eos >= 0) s.suffix.push_back(s.eos);
  backend->configure(std::move(s), fmt::format("SentencePiece tokenizer.model ({} pieces)", backend->vocab_size()));
  return backend;
}

std::unique_ptr<TokenizerBackend> load_sentencepiece_proto(const std::string& serialized, const std::string& source,
                                                           SpecialTokens specials, std::string description) {
  auto backend = std::make_unique<SentencePieceBackend>(
      source, [&](auto& sp) { return sp.LoadFromSerializedProto(serialized); });
  backend->configure(std::move(specials), std::move(description));
  return backend;
}

}  // namespace woq
