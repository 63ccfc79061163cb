#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"

namespace woq {

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string model = (fs::path(dir) / "tokenizer.model").string();
  std::error_code ec;
  if (!fs::exists(model, ec))
    fail("{}: not found (woq reads SentencePiece tokenizer.model; tokenizer.json is not supported yet)", model);
  require_regular_file(model, 256ull << 20);
  Tokenizer tok;
  const auto status = tok.sp_->Load(model);
  if (!status.ok()) fail("{}: not a SentencePiece model: {}", model, status.ToString());
  const std::string cfg = (fs::path(dir) / "tokenizer_config.json").string();
  if (fs::exists(cfg, ec)) tok.add_bos_ = JsonFields(read_json_file(cfg), cfg).boolean("add_bos_token", true);
  for (int id = 0; id < tok.sp_->GetPieceSize(); ++id) {
    const std::string piece = tok.sp_->IdToPiece(id);
    tok.max_piece_bytes_ = std::max<std::int64_t>(tok.max_piece_bytes_, static_cast<std::int64_t>(piece.size()));
    if (tok.sp_->IsControl(id) && !piece.empty()) tok.control_pieces_.emplace_back(piece, id);
  }
  return tok;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> pieces;
  const auto status = sp_->Encode(text, &pieces);
  if (!status.ok()) fail("tokenizer: cannot encode text: {}", status.ToString());
  std::vector<std::int32_t> ids;
  ids.reserve(pieces.size() + 1);
  if (add_bos_ && bos_id() >= 0) ids.push_back(bos_id());
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  std::vector<int> run;
  auto flush_run = [&] {
    if (run.empty()) return;
    std::string piece;
    const auto status = sp_->Decode(run, &piece);
    if (!status.ok()) fail("tokenizer: cannot decode: {}", status.ToString());
    text += piece;
    run.clear();
  };
  for (const auto id : ids) {
    if (id < 0 || id >= sp_->GetPieceSize()) {
      flush_run();
      text += fmt::format("<{}?>", id);
    } else {
      run.push_back(id);
    }
  }
  flush_run();
  return text;
}

std::vector<std::int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<std::int32_t> ids;
  const std::string bos = bos_id() >= 0 ? sp_->IdToPiece(bos_id()) : std::string();
  if (add_bos_ && bos_id() >= 0 && !(!bos.empty() && text.starts_with(bos))) ids.push_back(bos_id());
  auto encode_plain = [&](std::string_view part) {
    if (part.empty()) return;
    std::vector<int> pieces;
    const auto status = sp_->Encode(part, &pieces);
    if (!status.ok()) fail("tokenizer: cannot encode text: {}", status.ToString());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  };
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

std::string Tokenizer::token_text(std::int32_t id) const {
  if (id < 0 || id >= sp_->GetPieceSize()) return fmt::format("<{}?>", id);
  std::string p = sp_->IdToPiece(id);
  if (sp_->IsByte(id) && p.size() == 6 && p.starts_with("<0x")) return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
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

std::int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
std::int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

namespace {

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
std::size_t complete_utf8_prefix(std::string_view s) {
  std::size_t i = s.size();
  std::size_t back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(s[i - 1]);
    ++back;
    if ((c & 0xc0) != 0x80) {  // lead byte or ASCII
      const std::size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
      return back >= need ? s.size() : i - 1;
    }
    --i;
  }
  return s.size();
}

}  // namespace

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
  // An incomplete UTF-8 sequence (or the U+FFFD an incomplete byte-fallback
  // sequence may decode to) waits for the next tokens.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool incomplete =
      complete_utf8_prefix(text) < text.size() ||
      (text.size() >= kReplacement.size() && std::string_view(text).substr(text.size() - kReplacement.size()) == kReplacement);
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
