#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "server/openai_api.h"

namespace woq::server {

namespace {

using Json = nlohmann::ordered_json;

// Events of one request, from the engine's thread to the HTTP thread.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> tokens;
  std::optional<FinishEvent> finish;
};

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

std::string next_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  return fmt::format("{}-{:x}{:06x}", prefix, static_cast<std::uint64_t>(std::time(nullptr)), ++counter);
}

std::string sse(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

void log_request(const std::string& id, const FinishEvent& f) {
  const double decode = f.seconds - f.first_token_seconds;
  fmt::print(stderr, "woq: {} prompt {} tokens, completion {} tokens, first token {:.3f} s, {:.1f} tokens/s, finish {}{}\n",
             id, f.prompt_tokens, f.completion_tokens, f.first_token_seconds,
             f.completion_tokens > 1 && decode > 0 ? static_cast<double>(f.completion_tokens - 1) / decode : 0.0, f.reason,
             f.error.empty() ? "" : " (" + f.error + ")");
}

}  // namespace

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics,
                       HttpOptions options)
    : engine_(engine), tokenizer_(tokenizer), chat_(chat), metrics_(metrics), options_(std::move(options)),
      http_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0) fail("cannot listen on {}:{} (in use, or not an address of this machine)", options_.host, options_.port);
  return port;
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::stop() { http_->stop(); }

void HttpServer::routes() {
  httplib::Server& s = *http_;
  // Streaming clients hold a thread each, and queued requests wait in theirs.
  const auto threads = static_cast<std::size_t>(std::max<std::int64_t>(32, engine_.parallel() * 4));
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(32u << 20);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // No answer here is a byte range of a file: cpp-httplib would cut the JSON to a
    // Range header's bytes, so the parsed ranges are dropped (the request object
    // is this connection's own; the handler API only exposes it as const).
    const_cast<httplib::Request&>(req).ranges.clear();
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const bool bearer = auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0);
    if (bearer && auth.substr(7) == options_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    metrics_.request(false);
    send_json(res, 401,
              ApiError(401, req.has_header("Authorization") ? "Incorrect API key provided" : "Missing API key (Authorization: Bearer KEY)",
                       "invalid_request_error", "", "invalid_api_key")
                  .body());
    return httplib::Server::HandlerResponse::Handled;
  });
  // Generation requests log when they finish (log_request); every error answer gets a line here.
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    if (res.status < 400) return;
    std::string message;
    try {
      message = nlohmann::json::parse(res.body).at("error").at("message").get<std::string>();
    } catch (const std::exception&) {
    }
    fmt::print(stderr, "woq: {} {} -> {}{}{}\n", req.method, req.path.substr(0, 200), res.status, message.empty() ? "" : ": ",
               message.substr(0, 200));
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message = res.status == 404   ? fmt::format("Unknown endpoint {} {}", req.method, req.path)
                                : res.status == 413 ? std::string("The request body is too large")
                                : res.status == 400 ? std::string("Malformed HTTP request")
                                                    : fmt::format("HTTP error {}", res.status);
    send_json(res, res.status, ApiError(res.status, message, "invalid_request_error").body());
  });
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    metrics_.request(false);
    send_json(res, 500, ApiError(500, message, "server_error").body());
  });

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.text(), "text/plain; version=0.0.4");
  });
  auto model_json = [this] {
    return Json{{"id", options_.served_model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "woq"}};
  };
  s.Get("/v1/models", [this, model_json](const httplib::Request&, httplib::Response& res) {
    metrics_.request(true);
    send_json(res, 200, {{"object", "list"}, {"data", Json::array({model_json()})}});
  });
  s.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    const bool found = req.matches[1] == options_.served_model_name;
    metrics_.request(found);
    if (found) send_json(res, 200, model_json());
    else
      send_json(res, 404,
                ApiError(404, fmt::format("The model '{}' does not exist", req.matches[1].str()), "invalid_request_error", "model",
                         "model_not_found")
                    .body());
  });
  for (const bool chat : {false, true}) {
    s.Post(chat ? "/v1/chat/completions" : "/v1/completions", [this, chat](const httplib::Request& req, httplib::Response& res) {
      try {
        generate(req, res, chat);
      } catch (const ApiError& e) {
        metrics_.request(false);
        send_json(res, e.status, e.body());
      }
    });
  }
}

void HttpServer::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const ApiRequest r = parse_request(req.body, chat, options_.served_model_name);
  std::string text;
  if (chat) {
    try {
      text = chat_.render(r.messages, true, r.template_kwargs);
    } catch (const jinja::RaisedException& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "messages");
    } catch (const jinja::TemplateError& e) {
      throw ApiError(500, fmt::format("the model's chat template failed: {}", e.what()), "server_error");
    }
  }
  const std::string& prompt = chat ? text : r.prompt;
  const std::int64_t ctx = engine_.ctx_size();
  auto too_long = [&](const std::string& tokens) {
    return ApiError(400,
                    fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens "
                                "(at least one token must be left to generate).",
                                ctx, tokens),
                    "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
  };
  // A text this long cannot fit: refuse before tokenizing (which takes ~400 bytes of memory per byte).
  const auto lower_bound = static_cast<std::int64_t>(prompt.size()) / tokenizer_.max_piece_bytes();
  if (lower_bound >= ctx) throw too_long(fmt::format("at least {}", lower_bound));
  const std::vector<std::int32_t> ids = chat ? tokenizer_.encode_with_special(prompt) : tokenizer_.encode(prompt);
  const auto n = static_cast<std::int64_t>(ids.size());
  if (n >= ctx) throw too_long(std::to_string(n));
  if (ids.empty()) throw ApiError(400, "the prompt is empty", "invalid_request_error", "prompt");

  auto channel = std::make_shared<Channel>();
  auto er = std::make_shared<EngineRequest>();
  er->prompt = ids;
  er->max_tokens = r.max_tokens < 0 ? ctx - n : r.max_tokens;
  er->sampling = r.sampling;
  er->stop = r.stop;
  er->presence_penalty = r.presence_penalty;
  er->frequency_penalty = r.frequency_penalty;
  er->logprobs = r.logprobs;
  er->top_logprobs = r.top_logprobs;
  er->on_token = [channel](const TokenEvent& ev) {
    {
      std::lock_guard lock(channel->mu);
      channel->tokens.push_back(ev);
    }
    channel->cv.notify_all();
  };
  const std::string id = next_id(chat ? "chatcmpl" : "cmpl");
  er->on_finish = [channel, id](const FinishEvent& f) {
    log_request(id, f);  // every request, cancelled ones included
    {
      std::lock_guard lock(channel->mu);
      channel->finish = f;
    }
    channel->cv.notify_all();
  };
  try {
    engine_.submit(er);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error");
  }
  const auto created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string& model = options_.served_model_name;

  if (!r.stream) {
    std::unique_lock lock(channel->mu);
    channel->cv.wait(lock, [&] { return channel->finish.has_value(); });
    const FinishEvent f = *channel->finish;
    Generated g;
    for (const TokenEvent& ev : channel->tokens) g.text += ev.text;
    g.text += f.text;
    if (r.logprobs) g.tokens.assign(channel->tokens.begin(), channel->tokens.end());
    lock.unlock();
    if (f.reason == "error") throw ApiError(500, f.error, "server_error");
    g.finish_reason = f.reason;
    g.prompt_tokens = f.prompt_tokens;
    g.completion_tokens = f.completion_tokens;
    metrics_.request(true);
    send_json(res, 200, response_body(r, id, created, model, g, tokenizer_));
    return;
  }

  metrics_.request(true);
  res.set_header("Cache-Control", "no-cache");
  auto first = std::make_shared<bool>(true);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, channel, er, r, id, created, first](std::size_t, httplib::DataSink& sink) {
        std::vector<TokenEvent> events;
        std::optional<FinishEvent> finish;
        {
          std::unique_lock lock(channel->mu);
          while (channel->tokens.empty() && !channel->finish) {
            channel->cv.wait_for(lock, std::chrono::milliseconds(100));
            if (!sink.is_writable()) {
              er->cancelled = true;  // the client went away: free its slot
              return false;
            }
          }
          events.assign(channel->tokens.begin(), channel->tokens.end());
          channel->tokens.clear();
          finish = channel->finish;
        }
        const std::string& name = options_.served_model_name;
        std::string out;
        if (*first && r.chat) out += sse(chunk_body(r, id, created, name, "", {}, "", true, tokenizer_));
        *first = false;
        for (const TokenEvent& ev : events)
          if (!ev.text.empty() || r.logprobs) out += sse(chunk_body(r, id, created, name, ev.text, {ev}, "", false, tokenizer_));
        if (finish) {
          if (finish->reason == "error") {
            out += sse(ApiError(500, finish->error, "server_error").body());
          } else {
            out += sse(chunk_body(r, id, created, name, finish->text, {}, finish->reason, false, tokenizer_));
            if (r.include_usage) {
              Generated g;
              g.prompt_tokens = finish->prompt_tokens;
              g.completion_tokens = finish->completion_tokens;
              out += sse(usage_chunk(r, id, created, name, g));
            }
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          er->cancelled = true;
          return false;
        }
        if (finish) sink.done();
        return true;
      },
      [er](bool success) {
        if (!success) er->cancelled = true;
      });
}

}  // namespace woq::server
