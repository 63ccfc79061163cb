// The Jinja interpreter on an arbitrary template and context: the input is
// TEMPLATE, then a NUL byte, then the context as JSON (an object: the
// top-level variables; an array: the messages). Without a NUL, or when the
// context is not JSON, a fixed chat context is used. Parse errors, render
// errors and raise_exception are the expected outcomes (TemplateError).
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_common.h"
#include "jinja/jinja.h"

namespace {

using Json = nlohmann::ordered_json;

const Json& default_context() {
  static const Json c = Json::parse(R"({
    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "Hi there"},
                 {"role": "assistant", "content": "Hello!", "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "user", "content": "And 3+3?"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(begin, '\0', size);
  const std::size_t split = nul == nullptr ? size : static_cast<std::size_t>(static_cast<const char*>(nul) - begin);
  const std::string source(begin, split);
  Json context = default_context();
  if (nul != nullptr) {
    Json parsed = Json::parse(begin + split + 1, begin + size, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) {
      context = std::move(parsed);
    } else if (parsed.is_array()) {
      context["messages"] = std::move(parsed);
    }
  }
  try {
    const woq::jinja::Template t(source);
    (void)t.render(context);
  } catch (const woq::jinja::TemplateError&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
