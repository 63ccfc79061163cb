// woq serve's HTTP side: an OpenAI-compatible API over cpp-httplib.
//   GET  /health, /v1/models, /v1/models/{id}, /metrics (Prometheus text)
//   POST /v1/completions, /v1/chat/completions (JSON, or server-sent events with "stream": true)
#pragma once

#include <memory>
#include <string>

#include "generate/chat_template.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace woq::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 ///< 0 picks a free port
  std::string served_model_name;   ///< the "model" clients send and /v1/models lists
  std::string api_key;             ///< when set, /v1/* needs "Authorization: Bearer KEY"
};

class HttpServer {
 public:
  /// Everything passed in must outlive the server.
  HttpServer(Engine& engine, const Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics, HttpOptions options);
  ~HttpServer();

  /// Binds the address; returns the port. Throws woq::Error when it cannot.
  int bind();
  /// Serves until stop() (from another thread).
  void serve();
  void stop();

 private:
  void routes();
  /// POST /v1/completions (chat = false) and /v1/chat/completions. Throws ApiError.
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);

  Engine& engine_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_;
  Metrics& metrics_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace woq::server
