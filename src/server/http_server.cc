#include "server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "server/openai_api.h"
#include "server/tokenize_api.h"

namespace woq::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

using Json = nlohmann::ordered_json;

std::string dump(const Json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// "cmpl-<random per process><time><counter>": unique across the replicas behind one load balancer too (each
// process draws its own 32 random bits at start).
std::string next_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint32_t process = std::random_device{}();
  return fmt::format("{}-{:08x}{:x}{:06x}", prefix, process, static_cast<std::uint64_t>(std::time(nullptr)), ++counter);
}

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

// One piece of a chunked (Transfer-Encoding: chunked) body.
std::string http_chunk(const std::string& data) { return data.empty() ? std::string() : fmt::format("{:x}\r\n{}\r\n", data.size(), data); }

std::chrono::steady_clock::duration after(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

void log_request(const std::string& id, const FinishEvent& f) {
  const double decode = f.seconds - f.first_token_seconds;
  fmt::print(stderr, "woq: {} prompt {} tokens ({} cached), completion {} tokens, first token {:.3f} s, {:.1f} tokens/s, finish {}{}\n",
             id, f.prompt_tokens, f.cached_tokens, f.completion_tokens, f.first_token_seconds,
             f.completion_tokens > 1 && decode > 0 ? static_cast<double>(f.completion_tokens - 1) / decode : 0.0, f.reason,
             f.error.empty() ? "" : " (" + f.error + ")");
}

// Compares without an early exit, so timing does not reveal how much of a key matched.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[b.empty() ? 0 : i % b.size()]);
  return b.empty() ? a.empty() : diff == 0;
}

// %XX escapes of a URL path.
std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Engine callbacks reach connections through this; it is closed (under its mutex)
// before the io_context goes away, after which callbacks do nothing.
struct Gate {
  std::mutex mu;
  bool open = true;
};

}  // namespace

class Session;

struct HttpServer::Impl {
  Impl(Engine& e, const Tokenizer& t, const ChatTemplate& c, Metrics& m, HttpOptions o)
      : engine(e), tokenizer(t), chat(c), metrics(m), options(std::move(o)) {
    ioc.emplace(std::max(1, options.io_threads));
    strand.emplace(net::make_strand(*ioc));
    acceptor.emplace(*strand);
    retry_timer.emplace(*strand);
    deadline_timer.emplace(*strand);
    hard_timer.emplace(*strand);
    workers.emplace(static_cast<std::size_t>(std::max(1, options.io_threads)));
  }
  ~Impl();

  void accept();
  void begin_shutdown();
  /// Runs f(session) on each open session's strand.
  template <class F>
  void each_session(F f);
  std::vector<std::shared_ptr<Session>> open_sessions();
  void opened(Session* s, const std::shared_ptr<Session>& sp);
  void closed(Session* s);
  /// Takes `bytes` of the pending-body budget; false when it is spent.
  bool reserve(std::size_t bytes);

  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatTemplate& chat;
  Metrics& metrics;
  HttpOptions options;
  /// When the server started (Unix seconds): /v1/models' "created", as vLLM reports it.
  const std::int64_t started = static_cast<std::int64_t>(std::time(nullptr));
  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  std::atomic<std::int64_t> connections{0};
  std::atomic<std::size_t> pending_body{0};
  std::atomic<bool> draining{false};
  std::atomic<bool> destroying{false};
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  // Destroyed explicitly in ~Impl, while the members above still exist.
  std::optional<net::io_context> ioc;
  std::optional<net::strand<net::io_context::executor_type>> strand;  ///< acceptor, timers, shutdown
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry_timer, deadline_timer, hard_timer;
  std::optional<net::thread_pool> workers;  ///< parsing, chat templates, tokenizing
};

// One connection: reads requests one after another (pipelined ones wait in the
// buffer) and answers each before reading the next. Everything runs on the
// connection's strand; engine callbacks are posted to it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& s, tcp::socket socket) : s_(s), stream_(std::move(socket)) { ++s_.connections; }
  ~Session() {
    cancel_all();
    release();
    s_.closed(this);
  }

  void start() { read_header(); }
  auto executor() { return stream_.get_executor(); }

  /// Over the connection limit, or shutting down: a 503, then close.
  void refuse(const char* why) {
    keep_alive_ = false;
    respond_error(ApiError(503, why, "server_error"));
  }

  /// Shutdown began: an idle connection closes now (a request already arriving is still served, with
  /// Connection: close).
  void on_shutdown() {
    if (!reading_ || buffer_.size() != 0 || parser_->got_some()) return;
    // The header read is pending (a second read would be two at once): half-close, and let it
    // end with the client's close, or in a second.
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
  }

  /// The server is going away without running more handlers: drop the self-reference.
  void abandon() {
    cancel_all();
    self_.reset();
  }

  /// The shutdown deadline passed: drop a request still arriving, cancel the running generation.
  void on_deadline() {
    if (reading_) return close();  // a request still arriving
    if (ers_.empty()) return;
    shutdown_cancelled_ = true;
    cancel_all();
  }

 private:
  using Request = http::request<http::string_body>;

  struct Generation {
    ApiRequest r;
    std::string id;
    std::int64_t created = 0;
    std::vector<Generated> g;  // one per prompt; non-streaming: what is answered at the end
    std::size_t finished = 0;  // prompts whose generation ended
  };

  // Cancels every generation this connection runs (their on_finish still comes).
  void cancel_all() {
    for (const auto& er : ers_) er->cancelled = true;
  }

  void read_header() {
    if (s_.draining) return close();
    reading_ = true;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(s_.options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(s_.options.max_body_bytes);
    stream_.expires_after(after(s_.options.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return read_failed(ec);
    const auto& h = parser_->get();
    method_ = std::string(h.method_string());
    target_ = std::string(h.target());
    keep_alive_ = h.keep_alive();
    const boost::optional<std::uint64_t> length = parser_->content_length();
    if (length && *length > s_.options.max_body_bytes) return too_large();
    const auto coding = h[http::field::transfer_encoding];
    if (!coding.empty() && !beast::iequals(coding, "chunked")) {
      keep_alive_ = false;
      return respond_error(ApiError(501, "Transfer-Encoding other than chunked is not supported", "invalid_request_error"));
    }
    stream_.expires_after(after(s_.options.body_timeout_s));
    if (beast::iequals(h[http::field::expect], "100-continue") && !parser_->is_done()) {
      auto reply = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*reply), [self = shared_from_this(), reply](beast::error_code e, std::size_t) {
        if (e) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // Reads the body piece by piece, charging the pending-body budget with the bytes
  // actually received (a declared Content-Length costs nothing until it arrives).
  void read_body() {
    if (parser_->is_done()) return body_done();
    http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->read_failed(ec);
      const std::size_t have = self->parser_->get().body().size();
      if (have > self->reserved_) {
        if (!self->s_.reserve(have - self->reserved_)) {
          self->keep_alive_ = false;
          return self->respond_error(
              ApiError(503, "The server is receiving too many request bodies at once; retry later", "server_error"));
        }
        self->reserved_ = have;
      }
      self->read_body();
    });
  }

  void body_done() {
    reading_ = false;
    Request req = parser_->release();
    parser_.reset();
    handle(req);
    release();  // the body is gone with `req`
  }

  void read_failed(beast::error_code ec) {
    reading_ = false;
    if (ec == http::error::body_limit) return too_large();
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return respond_error(ApiError(431, "The request's headers are too large", "invalid_request_error"));
    }
    // Gone, timed out (a slow client), cancelled by shutdown, or cut short: nothing to answer.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == beast::error::timeout ||
        &ec.category() != &http::make_error_code(http::error::bad_target).category())
      return close();
    keep_alive_ = false;
    method_.clear();
    respond_error(ApiError(400, "Malformed HTTP request (" + ec.message() + ")", "invalid_request_error"));
  }

  void too_large() {
    keep_alive_ = false;
    respond_error(ApiError(413, fmt::format("The request body is too large (at most {} bytes)", s_.options.max_body_bytes),
                           "invalid_request_error"));
  }

  void release() {
    s_.pending_body -= reserved_;
    reserved_ = 0;
  }

  void handle(Request& req) {
    std::string_view target = target_;
    if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0) {  // absolute-form (RFC 9112 3.2.2)
      const std::size_t slash = target.find('/', target.find("//") + 2);
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
    }
    const std::string path = percent_decode(target.substr(0, target.find('?')));
    try {
      const bool tokenizer_path = path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info";
      if ((path.rfind("/v1/", 0) == 0 || tokenizer_path) && !s_.options.api_key.empty()) {
        const std::string auth(req[http::field::authorization]);
        const bool bearer = auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0);
        if (!bearer || !same_secret(auth.substr(7), s_.options.api_key))
          throw ApiError(401, req.count(http::field::authorization) ? "Incorrect API key provided" : "Missing API key (Authorization: Bearer KEY)",
                         "invalid_request_error", "", "invalid_api_key");
      }
      const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
      const std::string& name = s_.options.served_model_name;
      const Json model = {{"id", name}, {"object", "model"}, {"created", s_.started}, {"owned_by", "woq"}};
      if (get && path == "/health") return respond(200, dump({{"status", "ok"}}));
      if (get && path == "/metrics") return respond(200, s_.metrics.text(), "text/plain; version=0.0.4");
      if (get && path == "/v1/models") {
        s_.metrics.request(true);
        return respond(200, dump({{"object", "list"}, {"data", Json::array({model})}}));
      }
      if (get && path.rfind("/v1/models/", 0) == 0 && path.size() > 11) {
        if (path.substr(11) != name)
          throw ApiError(404, fmt::format("The model '{}' does not exist", printable(path.substr(11), 200)), "invalid_request_error",
                         "model", "model_not_found");
        s_.metrics.request(true);
        return respond(200, dump(model));
      }
      if (post && (path == "/v1/completions" || path == "/v1/chat/completions")) return prepare(std::move(req.body()), path == "/v1/chat/completions");
      if (get && path == "/tokenizer_info") {
        s_.metrics.request(true);
        return respond(200, dump(tokenizer_info(s_.tokenizer, s_.chat, s_.engine.ctx_size())));
      }
      if (post && path == "/tokenize")
        return answer_on_worker(std::move(req.body()), [](const HttpServer::Impl& s, const std::string& body) {
          return tokenize(body, s.tokenizer, s.chat, s.engine.ctx_size(), s.options.max_prompt_bytes, s.options.served_model_name);
        });
      if (post && path == "/detokenize")
        return answer_on_worker(std::move(req.body()), [](const HttpServer::Impl& s, const std::string& body) {
          return detokenize(body, s.tokenizer, s.options.served_model_name);
        });
      const bool known = path == "/health" || path == "/metrics" || path == "/v1/models" || path.rfind("/v1/models/", 0) == 0 ||
                         path == "/v1/completions" || path == "/v1/chat/completions" || tokenizer_path;
      if (known) {
        s_.metrics.request(false);
        return respond_error(ApiError(405, fmt::format("Method {} is not allowed on {}", printable(method_), path), "invalid_request_error"));
      }
      // Not an API request: not counted in /metrics.
      return respond_error(ApiError(404, fmt::format("Unknown endpoint {} {}", printable(method_), printable(path)), "invalid_request_error"));
    } catch (const ApiError& e) {
      s_.metrics.request(false);
      respond_error(e);
    } catch (const std::exception& e) {
      s_.metrics.request(false);
      respond_error(ApiError(500, e.what(), "server_error"));
    }
  }

  // Runs f; what it throws as an API error (another exception: a 500), or nullopt.
  template <typename F>
  static std::optional<ApiError> error_of(F f) {
    try {
      f();
    } catch (const ApiError& e) {
      return e;
    } catch (const std::exception& e) {
      return ApiError(500, e.what(), "server_error");
    }
    return std::nullopt;
  }

  // Computes the JSON answer to `body` on a worker thread (tokenizing is linear but
  // may take a while for a long text), then responds on this connection's strand.
  template <typename Answer>
  void answer_on_worker(std::string body, Answer answer) {
    net::post(*s_.workers, [self = shared_from_this(), body = std::move(body), answer]() mutable {
      std::string out;
      const std::optional<ApiError> error = error_of([&] { out = dump(answer(self->s_, body)); });
      body = std::string();
      auto ex = self->executor();
      net::post(ex, [self = std::move(self), out = std::move(out), error]() mutable {
        self->s_.metrics.request(!error);
        if (error) return self->respond_error(*error);
        self->respond(200, std::move(out));
      });
    });
  }

  // POST /v1/completions and /v1/chat/completions: parsing, the chat template and
  // tokenizing (up to seconds for a long prompt) run on the worker threads, so that
  // the I/O threads keep serving; then submit() on this connection's strand.
  void prepare(std::string body, bool chat) {
    net::post(*s_.workers, [self = shared_from_this(), body = std::move(body), chat]() mutable {
      auto gen = std::make_shared<Generation>();
      auto ers = std::make_shared<std::vector<std::shared_ptr<EngineRequest>>>();
      const std::optional<ApiError> error = error_of([&] { self->prepare_request(body, chat, *gen, *ers); });
      body = std::string();
      auto ex = self->executor();
      net::post(ex, [self = std::move(self), gen, ers, error] {
        if (error) {
          self->s_.metrics.request(false);
          return self->respond_error(*error);
        }
        try {
          self->submit(std::move(*gen), std::move(*ers));
        } catch (const ApiError& e) {
          self->s_.metrics.request(false);
          self->respond_error(e);
        }
      });
    });
  }

  // What prepare() does on a worker thread: one engine request per prompt. Throws ApiError.
  void prepare_request(const std::string& body, bool chat, Generation& gen,
                       std::vector<std::shared_ptr<EngineRequest>>& out) const {
    gen.r = parse_request(body, chat, s_.options.served_model_name);
    const ApiRequest& r = gen.r;
    std::vector<PromptInput> prompts = r.prompts;
    if (chat) {
      std::size_t content = 0;
      for (const auto& m : r.messages) content += m["content"].is_string() ? m["content"].get_ref<const std::string&>().size() : 0;
      refuse_long(content, "The messages' text", "messages");
      PromptInput rendered;
      try {
        rendered.text = s_.chat.render(r.messages, true, r.template_kwargs);
      } catch (const jinja::RaisedException& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "messages");
      } catch (const jinja::TemplateError& e) {
        throw ApiError(500, fmt::format("the model's chat template failed: {}", e.what()), "server_error");
      }
      rendered.param = "messages";
      prompts = {std::move(rendered)};
    }
    gen.g.resize(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto er = std::make_shared<EngineRequest>();
      prepare_prompt(r, prompts[i], *er, gen.g[i]);
      out.push_back(std::move(er));
    }
    gen.id = next_id(chat ? "chatcmpl" : "cmpl");
    gen.created = static_cast<std::int64_t>(std::time(nullptr));
  }

  // `param`: "messages", "prompt" or a batch's "prompt[i]".
  ApiError too_long(const std::string& what, const std::string& param) const {
    return ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, your prompt has {}.",
                                     s_.engine.ctx_size(), what),
                    "invalid_request_error", param, "context_length_exceeded");
  }

  // A byte budget before rendering and tokenizing (which take ~30 bytes of memory per byte): 4x the bytes
  // of ctx longest tokens (a bound, not a count: normalizers may shrink text, e.g. NFKC, collapsed spaces),
  // and at most max_prompt_bytes, which bounds the time tokenizing holds this worker (tokenizing is linear).
  // `what`: the messages' text, or the prompt (a chat's as its template renders it).
  void refuse_long(std::size_t bytes, const char* what, const std::string& param) const {
    const std::int64_t ctx = s_.engine.ctx_size();
    const std::int64_t ctx_bytes =
        ctx > INT64_MAX / 4 / s_.tokenizer.max_piece_bytes() ? INT64_MAX : 4 * ctx * s_.tokenizer.max_piece_bytes();
    const auto cap = static_cast<std::int64_t>(std::min<std::size_t>(s_.options.max_prompt_bytes, INT64_MAX));
    const auto n = static_cast<std::int64_t>(bytes);
    if (n > cap && cap <= ctx_bytes)
      throw ApiError(400, fmt::format("{} has {} bytes, more than the {} bytes this server accepts (--max-prompt-bytes)",
                                      what, bytes, cap),
                     "invalid_request_error", param, "context_length_exceeded");
    if (n > ctx_bytes) throw too_long(fmt::format("{} bytes, more than the {} bytes accepted for it", bytes, ctx_bytes), param);
  }

  // One prompt of the request (a chat's as its template renders it) into an engine request; `g` gets
  // what echo answers. Throws ApiError.
  void prepare_prompt(const ApiRequest& r, const PromptInput& p, EngineRequest& out, Generated& g) const {
    const std::int64_t ctx = s_.engine.ctx_size();
    std::vector<std::int32_t> ids;
    if (p.ids) {
      ids = *p.ids;
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] >= s_.engine.vocab_size())
          throw ApiError(400, fmt::format("'{}[{}]' is {}, outside the vocabulary [0, {})", p.param, i, ids[i],
                                          s_.engine.vocab_size()),
                         "invalid_request_error", fmt::format("{}[{}]", p.param, i));
    } else {
      refuse_long(p.text.size(), r.chat ? "The chat prompt (the messages as the chat template renders them)" : "The prompt",
                  p.param);
      ids = r.chat ? s_.tokenizer.encode_with_special(p.text) : s_.tokenizer.encode(p.text);
    }
    const auto n = static_cast<std::int64_t>(ids.size());
    const std::string which = r.prompts.size() > 1 ? fmt::format(" ('{}')", p.param) : std::string();
    if (n >= ctx) throw too_long(fmt::format("{} tokens{} (at least one token must be left to generate)", n, which), p.param);
    if (ids.empty()) throw ApiError(400, fmt::format("the prompt{} is empty", which), "invalid_request_error", p.param);

    out.prompt = ids;
    out.max_tokens = r.max_tokens < 0 ? ctx - n : r.max_tokens;
    out.sampling = r.sampling;
    out.stop = r.stop;
    out.presence_penalty = r.presence_penalty;
    out.frequency_penalty = r.frequency_penalty;
    out.penalties = r.penalties;
    out.logprobs = r.logprobs;
    out.top_logprobs = r.top_logprobs;
    out.prompt_logprobs = r.echo && r.logprobs;
    if (r.echo) {
      g.prompt_ids = ids;
      g.prompt_text = p.ids ? s_.tokenizer.decode(ids) : p.text;
    }
  }

  // Hands a prepared request to the engine and starts the answer. Throws ApiError.
  void submit(Generation gen, std::vector<std::shared_ptr<EngineRequest>> ers) {
    // The engine's thread posts each event to this connection's strand, holding the
    // connection only while the handler is queued.
    auto post = [gate = s_.gate, weak = weak_from_this()](auto handler) {
      std::lock_guard lock(gate->mu);
      if (!gate->open) return;
      if (std::shared_ptr<Session> self = weak.lock()) {
        auto ex = self->stream_.get_executor();
        net::post(ex, [self = std::move(self), handler = std::move(handler)]() mutable { handler(*self); });
      }
    };
    for (std::size_t i = 0; i < ers.size(); ++i) {
      ers[i]->on_token = [post, i, id = gen.id](const TokenEvent& ev) {
        post([ev, i, id](Session& s) { s.on_token(id, i, ev); });
      };
      ers[i]->on_finish = [post, i, id = gen.id](const FinishEvent& f) {
        log_request(id, f);  // every request, cancelled ones included
        post([f, i, id](Session& s) { s.on_finish(id, i, f); });
      };
    }
    // A batch is queued whole or not at all.
    try {
      s_.engine.submit_all(ers);
    } catch (const EngineBusy& e) {
      keep_alive_ = false;
      throw ApiError(503, e.what(), "server_error");
    } catch (const EngineTooLarge& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "prompt");
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "invalid_request_error");
    }
    ers_ = std::move(ers);
    gen_ = std::move(gen);
    self_ = shared_from_this();  // until on_finish: the engine holds the connection only weakly
    s_.metrics.request(true);
    watch_disconnect();
    if (!gen_->r.stream) return;
    out_ = fmt::format("HTTP/1.1 200 OK\r\nServer: woq\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                       // A reverse proxy (nginx) passes each event on at once rather than filling a buffer first.
                       "X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\nConnection: {}\r\n\r\n",
                       keep_alive_ ? "keep-alive" : "close");
    if (gen_->r.chat) out_ += http_chunk(sse(chunk_body(gen_->r, gen_->id, gen_->created, s_.options.served_model_name, "", {}, "", true, s_.tokenizer)));
    flush();
  }

  // A client that hangs up cancels its generation (a streaming one is also noticed
  // when a write fails). Pipelined bytes end the watch.
  void watch_disconnect() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->ers_.empty()) return;
      char c = 0;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) self->cancel_all();
      else if (n < 0) self->watch_disconnect();
    });
  }

  // Events of prompt i of generation `id` (ignored once the connection has moved on to another request).
  void on_token(const std::string& id, std::size_t i, const TokenEvent& ev) {
    if (!gen_ || gen_->id != id) return;
    const ApiRequest& r = gen_->r;
    if (!r.stream) {
      gen_->g[i].text += ev.text;
      if (r.logprobs) gen_->g[i].tokens.push_back(ev);
      return;
    }
    if (ev.text.empty() && !r.logprobs) return;
    out_ += http_chunk(sse(chunk_body(r, gen_->id, gen_->created, s_.options.served_model_name, ev.text, {ev}, "", false, s_.tokenizer)));
    flush();
  }

  void on_finish(const std::string& id, std::size_t i, const FinishEvent& f) {
    if (!gen_ || gen_->id != id) return;
    if (f.reason == "cancelled" || f.reason == "error") {  // one prompt's end ends the whole answer
      if (!first_end_) first_end_ = f;
    } else {
      Generated& g = gen_->g[i];
      g.text += f.text;
      g.prompt_logprobs = f.prompt;
      g.finish_reason = f.reason;
      g.prompt_tokens = f.prompt_tokens;
      g.completion_tokens = f.completion_tokens;
      g.cached_tokens = f.cached_tokens;
    }
    if (first_end_) cancel_all();
    if (++gen_->finished < gen_->g.size()) return;
    ers_.clear();
    const std::shared_ptr<Session> keep = std::move(self_);
    const FinishEvent end = first_end_ ? *first_end_ : f;
    first_end_.reset();
    const ApiRequest& r = gen_->r;
    const std::string& name = s_.options.served_model_name;
    const bool shutdown = end.reason == "cancelled" && shutdown_cancelled_;
    if (end.reason == "cancelled" && !shutdown) return close();  // the client went away
    if (!r.stream) {
      Generation gen = std::move(*gen_);
      gen_.reset();
      if (shutdown) return respond_error(ApiError(503, "The server is shutting down", "server_error"));
      if (end.reason == "error") return respond_error(ApiError(500, end.error, "server_error"));
      return respond(200, dump(response_body(r, gen.id, gen.created, name, gen.g, s_.tokenizer)));
    }
    std::string out;
    if (shutdown) {
      out += sse(ApiError(503, "The server is shutting down", "server_error").body());
    } else if (f.reason == "error") {
      out += sse(ApiError(500, f.error, "server_error").body());
    } else {
      out += sse(chunk_body(r, gen_->id, gen_->created, name, f.text, {}, f.reason, false, s_.tokenizer));
      if (r.include_usage) {
        Generated g;
        g.prompt_tokens = f.prompt_tokens;
        g.completion_tokens = f.completion_tokens;
        g.cached_tokens = f.cached_tokens;
        out += sse(usage_chunk(r, gen_->id, gen_->created, name, g));
      }
    }
    out += "data: [DONE]\n\n";
    out_ += http_chunk(out) + "0\r\n\r\n";
    stream_done_ = true;
    flush();
  }

  // Writes what the stream has queued; after the last chunk, reads the next request.
  void flush() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(out_));
    out_.clear();
    stream_.expires_after(after(s_.options.write_timeout_s));
    net::async_write(stream_, net::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec) return self->close();  // the destructor cancels the generation
      if (!self->out_.empty()) return self->flush();
      if (self->stream_done_) {
        self->stream_done_ = false;
        self->gen_.reset();
        self->next();
      }
    });
  }

  void respond_error(const ApiError& e) {
    fmt::print(stderr, "woq: {} {} -> {}: {}\n", method_.empty() ? "-" : printable(method_), target_.empty() ? "-" : printable(target_, 200), e.status,
               printable(e.what(), 200));
    respond(e.status, dump(e.body()));
  }

  void respond(int status, std::string body, const char* content_type = "application/json") {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "woq");
    res->set(http::field::content_type, content_type);
    res->keep_alive(keep_alive_ && !s_.draining);
    res->body() = std::move(body);
    res->prepare_payload();
    stream_.expires_after(after(s_.options.write_timeout_s));
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      if (!res->keep_alive()) return self->linger_close();
      self->next();
    });
  }

  void next() {
    if (keep_alive_ && !s_.draining) return read_header();
    linger_close();
  }

  // Half-closes and reads what the client still sends (up to a second), so that
  // unread input does not turn the close into a reset that loses the answer.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(std::chrono::seconds(1));
    drain();
  }

  void drain() {
    auto scratch = std::make_shared<std::array<char, 4096>>();
    stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  void close() {
    reading_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  HttpServer::Impl& s_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::size_t reserved_ = 0;  ///< bytes of the pending-body budget held
  bool reading_ = false;      ///< waiting for (or receiving) a request
  bool keep_alive_ = false;
  std::string method_, target_;  ///< of the current request, for the log
  std::vector<std::shared_ptr<EngineRequest>> ers_;  ///< the generations running for this connection (one per prompt)
  std::shared_ptr<Session> self_;                    ///< set while ers_ run
  std::optional<FinishEvent> first_end_;             ///< a batch's first cancelled or failed prompt
  std::optional<Generation> gen_;
  bool shutdown_cancelled_ = false;
  std::string out_;  ///< stream bytes not yet written
  bool writing_ = false, stream_done_ = false;
};

HttpServer::Impl::~Impl() {
  {
    std::lock_guard lock(gate->mu);
    gate->open = false;
  }
  // The threads have stopped: no handler runs concurrently with this.
  destroying = true;  // sessions destroyed from here on post nothing
  workers->stop();    // queued requests are dropped; one being tokenized finishes
  workers->join();
  workers.reset();
  for (const auto& sp : open_sessions()) sp->abandon();
  acceptor.reset();
  retry_timer.reset();
  deadline_timer.reset();
  hard_timer.reset();
  strand.reset();
  ioc.reset();  // destroys the queued handlers, and with them the sessions
}

std::vector<std::shared_ptr<Session>> HttpServer::Impl::open_sessions() {
  std::vector<std::shared_ptr<Session>> open;
  std::lock_guard lock(sessions_mu);
  for (auto& [ptr, weak] : sessions)
    if (auto sp = weak.lock()) open.push_back(std::move(sp));
  return open;
}

template <class F>
void HttpServer::Impl::each_session(F f) {
  for (auto& sp : open_sessions()) {
    Session& s = *sp;
    net::post(s.executor(), [sp, f]() { f(*sp); });
  }
}

void HttpServer::Impl::opened(Session* s, const std::shared_ptr<Session>& sp) {
  std::lock_guard lock(sessions_mu);
  sessions.emplace(s, sp);
}

void HttpServer::Impl::closed(Session* s) {
  {
    std::lock_guard lock(sessions_mu);
    sessions.erase(s);
  }
  if (--connections == 0 && draining && !destroying)
    net::post(*strand, [this] {
      deadline_timer->cancel();
      hard_timer->cancel();
    });
}

bool HttpServer::Impl::reserve(std::size_t bytes) {
  std::size_t now = pending_body.load();
  do {
    if (now + bytes > options.max_pending_body_bytes) return false;
  } while (!pending_body.compare_exchange_weak(now, now + bytes));
  return true;
}

void HttpServer::Impl::accept() {
  acceptor->async_accept(net::make_strand(*ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || draining) return;
    if (ec) {
      // Out of file descriptors (EMFILE) and the like: wait a little rather than spin.
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) fmt::print(stderr, "woq: accepting a connection failed: {}\n", ec.message());
      retry_timer->expires_after(std::chrono::milliseconds(50));
      retry_timer->async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    const bool over = connections >= options.max_connections;
    auto session = std::make_shared<Session>(*this, std::move(socket));
    opened(session.get(), session);
    net::dispatch(session->executor(), [session, over] { over ? session->refuse("The server has too many open connections; retry later") : session->start(); });
    accept();
  });
}

void HttpServer::Impl::begin_shutdown() {
  if (draining.exchange(true)) return;
  // Connections the kernel has queued get a 503 rather than a reset.
  beast::error_code ec;
  acceptor->non_blocking(true, ec);
  for (int i = 0; i < 4096 && !ec; ++i) {
    tcp::socket socket(net::make_strand(*ioc));
    acceptor->accept(socket, ec);
    if (ec) break;
    auto session = std::make_shared<Session>(*this, std::move(socket));
    opened(session.get(), session);
    net::dispatch(session->executor(), [session] { session->refuse("The server is shutting down"); });
  }
  acceptor->close(ec);
  retry_timer->cancel();
  each_session([](Session& s) { s.on_shutdown(); });
  deadline_timer->expires_after(after(options.shutdown_timeout_s));
  deadline_timer->async_wait([this](beast::error_code e) {
    if (e) return;
    each_session([](Session& s) { s.on_deadline(); });
    // Clients that do not read their last bytes do not hold the process.
    hard_timer->expires_after(std::chrono::seconds(2));
    hard_timer->async_wait([this](beast::error_code e2) {
      if (!e2) ioc->stop();
    });
  });
  if (connections == 0) {
    deadline_timer->cancel();
    hard_timer->cancel();
  }
}

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics, HttpOptions options) {
  if (options.io_threads < 1 || options.max_connections < 1 || options.max_body_bytes < 1 || options.max_prompt_bytes < 1 || options.header_timeout_s <= 0 ||
      options.body_timeout_s <= 0 || options.write_timeout_s <= 0 || options.shutdown_timeout_s < 0)
    fail("HTTP server options out of range (threads, connections, sizes and timeouts must be positive)");
  impl_ = std::make_unique<Impl>(engine, tokenizer, chat, metrics, std::move(options));
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  // Every connection is a file descriptor: take the hard limit, and keep the
  // connection cap under it (with room for the model's files and logs).
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    if (limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      setrlimit(RLIMIT_NOFILE, &limit);
      getrlimit(RLIMIT_NOFILE, &limit);
    }
    if (limit.rlim_cur != RLIM_INFINITY)
      s.options.max_connections = std::max<std::int64_t>(1, std::min<std::int64_t>(s.options.max_connections, static_cast<std::int64_t>(limit.rlim_cur) - 64));
  }
  try {
    const net::ip::address address = net::ip::make_address(s.options.host == "localhost" ? "127.0.0.1" : s.options.host);
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
    s.acceptor->open(endpoint.protocol());
    s.acceptor->set_option(net::socket_base::reuse_address(true));
    s.acceptor->bind(endpoint);
    s.acceptor->listen(net::socket_base::max_listen_connections);
    return s.acceptor->local_endpoint().port();
  } catch (const std::exception& e) {
    fail("cannot listen on {}:{} ({})", s.options.host, s.options.port, e.what());
  }
}

void HttpServer::serve() {
  Impl& s = *impl_;
  net::post(*s.strand, [&s] { s.accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < s.options.io_threads; ++i) threads.emplace_back([&s] { s.ioc->run(); });
  s.ioc->run();
  for (std::thread& t : threads) t.join();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  net::post(*s.strand, [&s] { s.begin_shutdown(); });
}

}  // namespace woq::server
