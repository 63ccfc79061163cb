// The real chat templates of the repository (tests/data/chat_templates,
// assets/tokenizers/*: ChatML, Llama 2, Mistral, Llama 3, Qwen3, woq's
// feature template, and the default) rendered as apply_chat_template does,
// with fuzzed messages: the first byte picks the template (bits 1..) and
// add_generation_prompt (bit 0); the rest is JSON, an array of messages or an
// object {"messages": [...], other kwargs such as "tools", "enable_thinking"}.
// Templates rejecting the messages (raise_exception, type errors) throw
// TemplateError: the expected outcome.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "generate/chat_template.h"
#include "jinja/jinja.h"

namespace {

using Json = nlohmann::ordered_json;

std::vector<woq::ChatTemplate>& templates() {
  static std::vector<woq::ChatTemplate> all = [] {
    std::vector<woq::ChatTemplate> v;
    const std::pair<const char*, const char*> bos_eos_llama3 = {"<|begin_of_text|>", "<|eot_id|>"};
    struct File {
      const char* path;
      const char* bos;
      const char* eos;
    };
    const File files[] = {
        {"tests/data/chat_templates/chatml.jinja", "", "<|im_end|>"},
        {"tests/data/chat_templates/features.jinja", "<s>", "</s>"},
        {"tests/data/chat_templates/llama3.jinja", bos_eos_llama3.first, bos_eos_llama3.second},
        {"tests/data/chat_templates/qwen3.jinja", "", "<|im_end|>"},
        {"assets/tokenizers/llama2/llama2_chat_template.jinja", "<s>", "</s>"},
        {"assets/tokenizers/llama2/mistral_v0.1_chat_template.jinja", "<s>", "</s>"},
    };
    for (const File& f : files) v.emplace_back(woq_fuzz::slurp(woq_fuzz::repo_file(f.path)), f.bos, f.eos, false);
    // The templates as the tokenizer_config.json files ship them.
    for (const char* rel : {"assets/tokenizers/llama3", "assets/tokenizers/qwen3"})
      v.push_back(woq::ChatTemplate::load(woq_fuzz::repo_file(rel)));
    v.emplace_back(woq::ChatTemplate::default_source(), "<s>", "</s>", true);
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  templates();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const woq::ChatTemplate& t = templates()[(data[0] >> 1) % templates().size()];
  const bool add_generation_prompt = (data[0] & 1) != 0;
  Json j = Json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  Json messages, kwargs = Json::object();
  if (j.is_array()) {
    messages = std::move(j);
  } else if (j.is_object()) {
    auto it = j.find("messages");
    messages = it != j.end() ? *it : Json::array();
    j.erase("messages");
    kwargs = std::move(j);
  } else {
    return 0;
  }
  try {
    (void)t.render(messages, add_generation_prompt, kwargs);
  } catch (const woq::jinja::TemplateError&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
