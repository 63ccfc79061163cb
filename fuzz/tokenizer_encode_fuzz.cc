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

namespace {

struct Loaded {
  std::unique_ptr<woq::Tokenizer> tok;
  bool round_trips;  ///< decode(encode(s)) == s for well-formed UTF-8 without "<|"
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> all = [] {
    std::vector<Loaded> v;
    const std::pair<const char*, bool> dirs[] = {{"assets/tokenizers/llama3", true},
                                                  {"assets/tokenizers/qwen3", false},
                                                  {"assets/tokenizers/gpt2", true},
                                                  {"assets/tokenizers/llama2", false},
                                                  {"assets/models/stories260K", false}};
    for (const auto& [dir, rt] : dirs)
      v.push_back({std::make_unique<woq::Tokenizer>(woq::Tokenizer::load(woq_fuzz::repo_file(dir))), rt});
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const Loaded& t = tokenizers()[data[0] % tokenizers().size()];
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
