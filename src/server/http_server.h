// woq serve's HTTP side: an OpenAI-compatible API over Boost.Beast (Debian's
// libboost-dev), event-driven: a few I/O threads serve every connection, so an
// idle, slow or hostile client costs a socket and a buffer, never a thread.
//   GET  /health, /v1/models, /v1/models/{id}, /metrics (Prometheus text)
//   POST /v1/completions, /v1/chat/completions (JSON, or server-sent events with "stream": true)
//
// What a client cannot do: hold a connection by sending slowly (the request
// line and headers must arrive within header_timeout_s, a body within
// body_timeout_s), send more than max_body_bytes (chunked bodies included, as
// they arrive), open more than max_connections (the rest get a 503 and are
// closed), or stall shutdown (stop() finishes or cancels in-flight work within
// shutdown_timeout_s; open streams get an error event and [DONE]). Pipelined
// requests are answered in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "generate/chat_template.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace woq::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 ///< 0 picks a free port
  std::string served_model_name;   ///< the "model" clients send and /v1/models lists
  std::string api_key;             ///< when set, /v1/* needs "Authorization: Bearer KEY"
  std::size_t max_header_bytes = 64 << 10;  ///< request line + headers; more is a 431
  std::size_t max_body_bytes = 32 << 20;    ///< more is a 413
  /// A prompt's bytes (or the chat messages' content and the rendered template) at most: the bound on the
  /// time one request holds a worker thread tokenizing (linear in the bytes, at least ~3 MB/s on the most
  /// pathological text tests/hostile_text_test.cc measures, so about 3 s). A longer prompt is a 400
  /// context_length_exceeded, as is one over 4 x ctx x the longest token's bytes.
  std::size_t max_prompt_bytes = 8 << 20;
  /// Bodies being received at once, in bytes (a chunked body counts max_body_bytes); a request
  /// over the budget is a 503.
  std::size_t max_pending_body_bytes = std::size_t{1} << 30;
  std::int64_t max_connections = 4096;  ///< open at once (capped by the file descriptor limit)
  double header_timeout_s = 10;         ///< a request's line and headers, and a keep-alive connection's idle time
  double body_timeout_s = 60;           ///< a request's whole body
  double write_timeout_s = 60;          ///< any one write to a client that does not read
  double shutdown_timeout_s = 5;        ///< stop(): in-flight requests finish within this, or are cancelled
  int io_threads = 2;                   ///< threads parsing, tokenizing and writing (generation runs in the Engine)
};

class HttpServer {
 public:
  /// Everything passed in must outlive the server. Throws woq::Error for options out of range.
  HttpServer(Engine& engine, const Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics, HttpOptions options);
  /// Cancels the requests it submitted that are still running.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds the address and listens; returns the port. Throws woq::Error when it cannot.
  int bind();
  /// Serves until stop() has finished shutting down.
  void serve();
  /// Starts a graceful shutdown (thread-safe; later calls do nothing): stops accepting, closes idle
  /// connections, lets in-flight requests finish for shutdown_timeout_s, then cancels the rest
  /// (streams get an error event and [DONE], others a 503) and makes serve() return.
  void stop();

 private:
  friend class Session;  // a connection (http_server.cc)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace woq::server
