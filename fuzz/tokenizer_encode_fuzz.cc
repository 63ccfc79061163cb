// Arbitrary text through the real tokenizers of the repository (loaded once):
// the first byte picks one (Llama 3 and Qwen3 tokenizer.json, GPT-2
// vocab.json + merges.txt, Llama 2 and stories260K SentencePiece), the rest
// is the text. Checks the API's promises (tokenizer_check.h) and, for the
// byte-level tokenizers without a normalizer (Llama 3, GPT-2), that well-formed
// UTF-8 without special-token text decodes back to itself. The same bytes,
// read as little-endian int32 ids, are decoded and streamed.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  woq_fuzz::bundled_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& all = woq_fuzz::bundled_tokenizers();
  const woq_fuzz::BundledTokenizer& t = all[data[0] % all.size()];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const std::vector<std::int32_t> ids = woq_fuzz::exercise_encode(*t.tok, text);
    if (t.round_trips && woq_fuzz::valid_utf8(text) && text.find("<|") == std::string_view::npos) {
      const std::string back = t.tok->decode(ids);
      WOQ_FUZZ_CHECK(back == text, "round trip of " + woq::printable(text) + " gave " + woq::printable(back));
    }
    std::vector<std::int32_t> raw((size - 1) / 4);
    if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
    woq_fuzz::exercise_decode(*t.tok, raw);
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
