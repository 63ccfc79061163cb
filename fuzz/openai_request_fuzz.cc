// The OpenAI request parser on arbitrary bodies: parse_request(body, chat,
// model) for both /v1/chat/completions and /v1/completions; a chat request
// it accepts is then rendered with the default (ChatML) template as the
// server would render it. The same body goes to /tokenize and /detokenize
// (stories260K's SentencePiece tokenizer, fuzz/data). ApiError (400/404) is
// the expected outcome.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "generate/chat_template.h"
#include "jinja/jinja.h"
#include "server/openai_api.h"
#include "server/tokenize_api.h"
#include "tokenizer/tokenizer.h"

namespace {

const woq::Tokenizer& tokenizer() {
  static const woq::Tokenizer t = [] {
    static woq_fuzz::ScratchDir dir;
    dir.write("tokenizer.model", woq_fuzz::slurp(woq_fuzz::repo_file("fuzz/data/stories260K/tokenizer.model")));
    return woq::Tokenizer::load(dir.path());
  }();
  return t;
}

// /tokenize and /detokenize: an answer of the documented shape, or an ApiError.
void tokenizer_endpoints(const std::string& body, const woq::ChatTemplate& chat) {
  try {
    const auto t = woq::server::tokenize(body, tokenizer(), chat, 512, 1 << 16, "woq");
    WOQ_FUZZ_CHECK(t["count"] == t["tokens"].size() && t["max_model_len"] == 512, "tokenize answer");
  } catch (const woq::server::ApiError& e) {
    WOQ_FUZZ_CHECK(e.status == 400 || e.status == 404 || e.status == 500, "tokenize status " + std::to_string(e.status));
  }
  try {
    const auto d = woq::server::detokenize(body, tokenizer(), "woq");
    WOQ_FUZZ_CHECK(d["prompt"].is_string(), "detokenize answer");
  } catch (const woq::server::ApiError& e) {
    WOQ_FUZZ_CHECK(e.status == 400 || e.status == 404, "detokenize status " + std::to_string(e.status));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  static const woq::ChatTemplate chatml(woq::ChatTemplate::default_source(), "<s>", "</s>", true);
  for (const bool chat : {true, false}) {
    try {
      const woq::server::ApiRequest r = woq::server::parse_request(body, chat, "woq");
      WOQ_FUZZ_CHECK(r.chat == chat, "chat flag");
      WOQ_FUZZ_CHECK(r.model.empty() || r.model == "woq", "model " + r.model);
      WOQ_FUZZ_CHECK(r.max_tokens >= -1, "max_tokens");
      WOQ_FUZZ_CHECK(r.template_kwargs.is_object(), "template_kwargs");
      WOQ_FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= 20, "top_logprobs");
      WOQ_FUZZ_CHECK(r.stop.size() <= 16, "stop");
      if (chat) {
        WOQ_FUZZ_CHECK(r.messages.is_array() && !r.messages.empty(), "messages");
        for (const auto& m : r.messages)
          WOQ_FUZZ_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m["content"].is_string(),
                         "message shape");
        try {
          (void)chatml.render(r.messages, true, r.template_kwargs);
        } catch (const woq::jinja::TemplateError&) {
        }
      }
      (void)woq::server::ApiError(400, "x", "invalid_request_error", "p").body();
    } catch (const woq::server::ApiError& e) {
      WOQ_FUZZ_CHECK(e.status == 400 || e.status == 404, "status " + std::to_string(e.status));
      (void)e.body().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    } catch (const nlohmann::json::exception& e) {
      woq_fuzz::json_exception(e);
    }
  }
  tokenizer_endpoints(body, chatml);
  return 0;
}
