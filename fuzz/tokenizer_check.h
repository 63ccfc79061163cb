// Exercises a loaded tokenizer the way woq uses one (encode a prompt, decode
// and stream generated ids, token_text for logprobs) and checks what the
// API promises; shared by the tokenizer harnesses.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

namespace woq_fuzz {

/// A real tokenizer of the repository, loaded once.
struct BundledTokenizer {
  std::unique_ptr<woq::Tokenizer> tok;
  bool round_trips;  ///< decode(encode(s)) == s for well-formed UTF-8 without "<|"
};

/// The repository's real tokenizers: Llama 3 and Qwen3 tokenizer.json, GPT-2 vocab.json + merges.txt,
/// Llama 2 and stories260K SentencePiece.
inline std::vector<BundledTokenizer>& bundled_tokenizers() {
  static std::vector<BundledTokenizer> all = [] {
    std::vector<BundledTokenizer> v;
    const std::pair<const char*, bool> dirs[] = {{"assets/tokenizers/llama3", true},
                                                  {"assets/tokenizers/qwen3", false},
                                                  {"assets/tokenizers/gpt2", true},
                                                  {"assets/tokenizers/llama2", false},
                                                  {"assets/models/stories260K", false}};
    for (const auto& [dir, rt] : dirs)
      v.push_back({std::make_unique<woq::Tokenizer>(woq::Tokenizer::load(repo_file(dir))), rt});
    return v;
  }();
  return all;
}

/// Encodes `text` every way woq does and checks the results: ids inside the
/// vocabulary, special tokens only adding ids, decode and TextStream accepting
/// the ids. Returns encode(text, false).
inline std::vector<std::int32_t> exercise_encode(const woq::Tokenizer& tok, std::string_view text) {
  const std::int64_t vocab = tok.vocab_size();
  WOQ_FUZZ_CHECK(vocab > 0, "empty vocabulary");
  WOQ_FUZZ_CHECK(tok.max_piece_bytes() >= 1, "max_piece_bytes < 1");
  const std::vector<std::int32_t> plain = tok.encode(text, false);
  const std::vector<std::int32_t> with = tok.encode(text, true);
  const std::vector<std::int32_t> chat = tok.encode_with_special(text);
  for (const auto* ids : {&plain, &with, &chat})
    for (const std::int32_t id : *ids)
      WOQ_FUZZ_CHECK(id >= 0 && id < vocab, "id " + std::to_string(id) + " outside [0, " + std::to_string(vocab) + ")");
  WOQ_FUZZ_CHECK(with.size() >= plain.size() && chat.size() >= plain.size(), "special tokens removed ids");
  // max_piece_bytes(): the most bytes one token's text has (tokenizer.h).
  for (const std::int32_t id : plain)
    WOQ_FUZZ_CHECK(static_cast<std::int64_t>(tok.token_text(id).size()) <= tok.max_piece_bytes(),
                   "token " + std::to_string(id) + " has " + std::to_string(tok.token_text(id).size()) +
                       " bytes, more than max_piece_bytes " + std::to_string(tok.max_piece_bytes()));
  (void)tok.decode(with);
  woq::TextStream stream(tok);
  std::size_t k = 0;
  for (const std::int32_t id : plain) {
    (void)stream.push(id);
    (void)tok.token_text(id);
    if (++k == 64) break;
  }
  (void)stream.flush();
  (void)tok.bos_id();
  (void)tok.eos_id();
  (void)tok.add_bos();
  (void)tok.describe();
  return plain;
}

/// Decodes and streams arbitrary ids (out-of-vocabulary and negative ones
/// included: decode() promises "<ID?>" for those).
inline void exercise_decode(const woq::Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  (void)tok.decode(ids);
  woq::TextStream stream(tok);
  if (ids.size() > 1) stream.set_context({ids[0]});
  for (std::size_t i = 1; i < ids.size(); ++i) (void)stream.push(ids[i]);
  (void)stream.flush();
  for (const std::int32_t id : ids) (void)tok.token_text(id);
}

}  // namespace woq_fuzz
