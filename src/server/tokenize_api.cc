#include "server/tokenize_api.h"

#include <fmt/format.h>

#include "jinja/jinja.h"
#include "server/request_fields.h"

namespace woq::server {

using namespace fields;

namespace {

Json token_or_null(const Tokenizer& tokenizer, std::int32_t id) {
  return id < 0 ? Json(nullptr) : Json(tokenizer.token_text(id));
}

// Fields vLLM's TokenizeRequest has that woq cannot honour: refused unless they ask for the default.
void refuse_unsupported(const Json& j) {
  const auto refuse = [&](const char* key, const Json& neutral) {
    if (const Json* v = field(j, key); v != nullptr && *v != neutral)
      bad(key, fmt::format("'{}' is not supported by woq serve", key));
  };
  refuse("return_token_strs", false);
  refuse("continue_final_message", false);
  refuse("tools", Json::array());
  refuse("chat_template", "");
  refuse("mm_processor_kwargs", Json::object());
}

std::vector<std::int32_t> chat_ids(const Json& j, const Tokenizer& tokenizer, const ChatTemplate& chat,
                                   std::size_t max_prompt_bytes) {
  const Json messages = parse_messages(j);
  const Json kwargs = parse_template_kwargs(j);
  const bool add_generation_prompt = boolean(j, "add_generation_prompt").value_or(true);
  if (boolean(j, "add_special_tokens").value_or(false))
    bad("add_special_tokens", "'add_special_tokens' with 'messages' must be false: the chat template places the "
                              "special tokens (the ids are those a chat completion prefills)");
  std::size_t bytes = 0;
  for (const auto& m : messages) bytes += m["content"].get_ref<const std::string&>().size();
  if (bytes > max_prompt_bytes)
    bad("messages", fmt::format("the messages' text has {} bytes, more than the {} bytes this server accepts "
                                "(--max-prompt-bytes)", bytes, max_prompt_bytes));
  std::string text;
  try {
    text = chat.render(messages, add_generation_prompt, kwargs);
  } catch (const jinja::RaisedException& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "messages");
  } catch (const jinja::TemplateError& e) {
    throw ApiError(500, fmt::format("the model's chat template failed: {}", e.what()), "server_error");
  }
  if (text.size() > max_prompt_bytes)
    bad("messages", fmt::format("the chat prompt (the messages as the chat template renders them) has {} bytes, more "
                                "than the {} bytes this server accepts (--max-prompt-bytes)", text.size(), max_prompt_bytes));
  return tokenizer.encode_with_special(text);
}

}  // namespace

nlohmann::ordered_json tokenizer_info(const Tokenizer& tokenizer, const ChatTemplate& chat, std::int64_t max_model_len) {
  return {{"tokenizer_class", "woq"},
          {"description", tokenizer.describe()},
          {"bos_token", token_or_null(tokenizer, tokenizer.bos_id())},
          {"eos_token", token_or_null(tokenizer, tokenizer.eos_id())},
          {"pad_token", nullptr},
          {"add_bos_token", tokenizer.add_bos()},
          {"chat_template", chat.source()},
          {"model_max_length", max_model_len},
          {"vocab_size", tokenizer.vocab_size()}};
}

nlohmann::ordered_json tokenize(const std::string& body, const Tokenizer& tokenizer, const ChatTemplate& chat,
                                std::int64_t max_model_len, std::size_t max_prompt_bytes,
                                const std::string& served_model) {
  const Json j = parse_object(body);
  check_model(j, served_model);
  refuse_unsupported(j);
  const Json* prompt = field(j, "prompt");
  const bool messages = field(j, "messages") != nullptr;
  if ((prompt != nullptr) == messages) bad("prompt", "give one of 'prompt' (a string) and 'messages'");
  std::vector<std::int32_t> ids;
  if (messages) {
    ids = chat_ids(j, tokenizer, chat, max_prompt_bytes);
  } else {
    if (!prompt->is_string()) bad("prompt", "'prompt' must be a string");
    const std::string& text = prompt->get_ref<const std::string&>();
    if (text.size() > max_prompt_bytes)
      bad("prompt", fmt::format("'prompt' has {} bytes, more than the {} bytes this server accepts (--max-prompt-bytes)",
                                text.size(), max_prompt_bytes));
    ids = tokenizer.encode(text, boolean(j, "add_special_tokens").value_or(true));
  }
  return {{"count", ids.size()}, {"max_model_len", max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
}

nlohmann::ordered_json detokenize(const std::string& body, const Tokenizer& tokenizer, const std::string& served_model) {
  const Json j = parse_object(body);
  check_model(j, served_model);
  const Json* tokens = field(j, "tokens");
  if (tokens == nullptr) bad("tokens", "'tokens' is required");
  if (!tokens->is_array()) bad("tokens", "'tokens' must be a list of token ids");
  std::vector<std::int32_t> ids;
  ids.reserve(tokens->size());
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    const std::string param = fmt::format("tokens[{}]", i);
    if (!t.is_number_integer()) bad(param, fmt::format("'{}' must be an integer token id, not {}", param, t.type_name()));
    const bool in_range = t.is_number_unsigned() ? t.get<std::uint64_t>() < static_cast<std::uint64_t>(tokenizer.vocab_size())
                                                 : t.get<std::int64_t>() >= 0 && t.get<std::int64_t>() < tokenizer.vocab_size();
    if (!in_range) bad(param, fmt::format("'{}' is {}, outside the vocabulary [0, {})", param, t.dump(), tokenizer.vocab_size()));
    ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  return {{"prompt", tokenizer.decode(ids)}};
}

}  // namespace woq::server
