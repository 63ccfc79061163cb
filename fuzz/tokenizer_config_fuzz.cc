// tokenizer_config.json on arbitrary bytes, read by everything that reads it:
// Tokenizer::load with each tokenizer kind beside it (a small tokenizer.json,
// a SentencePiece tokenizer.model, a GPT-2 vocab.json + merges.txt: fixed
// files of fuzz/data/), which takes bos/eos tokens and add_bos/eos_token from
// it, and ChatTemplate::load, which takes bos/eos and the chat template
// (rendered once with fixed messages).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_common.h"
#include "generate/chat_template.h"
#include "jinja/jinja.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_check.h"

namespace {

struct Dirs {
  woq_fuzz::ScratchDir hf, spm, gpt2;
  Dirs() {
    const auto data = [](const char* rel) { return woq_fuzz::slurp(woq_fuzz::repo_file(std::string("fuzz/data/") + rel)); };
    hf.write("tokenizer.json", data("llama3_small/tokenizer.json"));
    spm.write("tokenizer.model", data("stories260K/tokenizer.model"));
    gpt2.write("vocab.json", data("gpt2_small/vocab.json"));
    gpt2.write("merges.txt", data("gpt2_small/merges.txt"));
  }
};

Dirs& dirs() {
  static Dirs d;
  return d;
}

const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <s>"},
          {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"}])");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dirs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view config(reinterpret_cast<const char*>(data), size);
  for (const woq_fuzz::ScratchDir* d : {&dirs().hf, &dirs().spm, &dirs().gpt2}) {
    d->write("tokenizer_config.json", config);
    try {
      const woq::Tokenizer tok = woq::Tokenizer::load(d->path());
      const std::int64_t vocab = tok.vocab_size();
      WOQ_FUZZ_CHECK(tok.bos_id() >= -1 && tok.bos_id() < vocab, "bos " + std::to_string(tok.bos_id()));
      WOQ_FUZZ_CHECK(tok.eos_id() >= -1 && tok.eos_id() < vocab, "eos " + std::to_string(tok.eos_id()));
      woq_fuzz::exercise_encode(tok, "Hello world <s> </s> <|begin_of_text|> <|endoftext|>");
    } catch (const woq::Error&) {
    } catch (const nlohmann::json::exception& e) {
      woq_fuzz::json_exception(e);
    }
  }
  try {
    const woq::ChatTemplate chat = woq::ChatTemplate::load(dirs().spm.path());
    for (const bool gen : {false, true}) {
      try {
        (void)chat.render(messages(), gen);
      } catch (const woq::jinja::TemplateError&) {
        // Includes RaisedException: a template refusing the messages.
      }
    }
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
