// tokenizer.json on arbitrary bytes: the input is written as a tokenizer.json
// (the loader takes a path) and loaded by load_tokenizer_json (model, added
// tokens, normalizer, pre-tokenizer, post-processor, decoder; regexes through
// PCRE2); a tokenizer it accepts then encodes and decodes a few texts.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  const std::string path = dir.write("tokenizer.json", {reinterpret_cast<const char*>(data), size});
  try {
    woq::Tokenizer tok(woq::load_tokenizer_json(path, nullptr));
    static const char* const kTexts[] = {
        "Hello world! Don't  stop\n\n\tnow 12345 caf\xC3\xA9 cafe\xCC\x81 \xEF\xAC\x81 \xE4\xB8\xAD \xF0\x9F\xA6\x99",
        "<s>[INST] hello WORLD <mask> x [/INST]</s><|begin_of_text|><|endoftext|>",
        "\xE2\x96\x81\xE2\x96\x81 abc xyz\xff\xfe\xc3",
        "",
    };
    for (const char* t : kTexts) woq_fuzz::exercise_encode(tok, t);
    // Every id up to a bound, and a few outside the vocabulary.
    std::vector<std::int32_t> ids;
    const auto vocab = static_cast<std::int32_t>(std::min<std::int64_t>(tok.vocab_size(), 512));
    for (std::int32_t id = 0; id < vocab; ++id) ids.push_back(id);
    ids.push_back(-1);
    ids.push_back(static_cast<std::int32_t>(std::min<std::int64_t>(tok.vocab_size(), INT32_MAX)));
    woq_fuzz::exercise_decode(tok, ids);
    for (const char* t : {"<s>", "</s>", "a", "<|endoftext|>"}) (void)tok.token_id(t);
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
