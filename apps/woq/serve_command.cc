// woq serve: load a model, then answer the OpenAI API until SIGINT/SIGTERM.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <memory>
#include <thread>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "generate/generate.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/sequence_caches.h"
#include "tokenizer/tokenizer.h"

namespace woq::cli {

namespace {

struct ServeArgs {
  std::string model_dir;
  std::string low_bit;  ///< empty: the default (add_low_bit_flag)
  ModelFlags model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::int64_t parallel = 4;
  std::int64_t ctx_size = 0;
  std::string served_model_name;
  std::string api_key;
  double shutdown_timeout = 5;
  std::int64_t max_connections = 4096;
  std::int64_t max_queue = 256;
  std::int64_t max_prompt_bytes = 8 << 20;
  std::int64_t prefill_chunk = server::kAutoPrefillChunk;
  double cache_gb = -1;
};

// SIGINT/SIGTERM write their number to a pipe (async-signal-safe) that a
// thread reads to stop the server: libraries may have started threads that
// do not block signals, so any thread can take the signal.
int stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] const auto n = write(stop_pipe[1], &c, 1);
}

int run_serve(const ServeArgs& a) {
  if (pipe(stop_pipe) != 0) fail("cannot create a pipe for signal handling");
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  // mpirun -np R: pipeline parallel. Rank 0 serves HTTP and schedules; rank r runs the r-th share of the
  // blocks, replaying rank 0's KV cache operations (SequenceCaches::follow).
  Ranks& ranks = job();
  LoadOptions load = load_options(a.model, a.low_bit);
  ModelSession session;
  session.open(a.model_dir, a.model.threads);
  pipeline_share(ranks, session.config, a.model_dir, a.model, load);
  load_session(session, load);
  const Tokenizer& tokenizer = *session.tokenizer;
  const ChatTemplate& chat = *session.chat_template;
  LlamaModel* const model = session.model.get();
  if (ranks.size() > 1) {
    model->set_pipeline(ranks);
    const std::string memory = pipeline_memory(ranks, session.config);
    if (!ranks.leader()) {
      // Rank 0 stops the job: on SIGINT/SIGTERM it drains its requests, then tells the others to stop.
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
      server::SequenceCaches::follow(*model, ranks);
      return 0;
    }
    fmt::print(stderr, "{}", memory);
  }
  server::Metrics metrics;
  server::EngineOptions options;
  options.parallel = a.parallel;
  options.ctx_size = a.ctx_size;
  options.max_queued = a.max_queue;
  options.prefill_chunk = a.prefill_chunk;
  if (a.cache_gb < 0 && a.cache_gb != -1) fail("--cache-gb must be >= 0 or -1 (the default size), got {}", a.cache_gb);
  options.cache_bytes = a.cache_gb < 0 ? -1 : static_cast<std::int64_t>(a.cache_gb * (1 << 30));
  options.pipeline = &ranks;
  server::Engine engine(*model, tokenizer, metrics, options);
  if (engine.ctx_size() < model->context_limit() && a.ctx_size == 0)
    fmt::print(stderr, "woq: context lowered from the model's {} to {} tokens: {} such KV caches fit in the memory available\n",
               model->context_limit(), engine.ctx_size(), engine.parallel());
  server::HttpOptions http;
  http.host = a.host;
  http.port = a.port;
  http.api_key = a.api_key;
  http.shutdown_timeout_s = a.shutdown_timeout;
  http.max_connections = a.max_connections;
  http.max_prompt_bytes = static_cast<std::size_t>(a.max_prompt_bytes);
  http.served_model_name =
      a.served_model_name.empty() ? std::filesystem::path(a.model_dir).lexically_normal().filename().string() : a.served_model_name;
  if (http.served_model_name.empty()) http.served_model_name = "woq";
  server::HttpServer server(engine, tokenizer, chat, metrics, http);
  const int port = server.bind();
  fmt::print(stderr, "woq: chat template: {}\n",
             chat.is_default() ? "none in the model directory; using the ChatML default" : "the model's");
  std::string stops;
  for (const std::int32_t id : end_of_generation_ids(model->config(), tokenizer))
    stops += fmt::format("{}{} {}", stops.empty() ? "" : ", ", id, tokenizer.token_text(id));
  fmt::print(stderr, "woq: tokenizer: {}; stop tokens: {}\n", tokenizer.describe(), stops.empty() ? "none" : stops);
  fmt::print(stderr, "woq: serving '{}' on http://{}:{} ({} sequence{} at once, {} tokens each, prefix cache {}{})\n",
             http.served_model_name, a.host, port, engine.parallel(), engine.parallel() == 1 ? "" : "s", engine.ctx_size(),
             engine.cache_bytes() == 0 ? std::string("off")
             : engine.cache_bytes() < (1 << 30) ? fmt::format("{:.1f} MiB", static_cast<double>(engine.cache_bytes()) / (1 << 20))
                                                 : fmt::format("{:.2f} GiB", static_cast<double>(engine.cache_bytes()) / (1 << 30)),
             a.api_key.empty() ? "" : ", API key required");
  if (ranks.size() > 1)  // mpirun kills its ranks about 2 s after forwarding a signal: too soon to drain
    fmt::print(stderr, "woq: rank 0 is pid {}: SIGTERM to it drains the requests, then every rank stops\n", getpid());
  std::thread waiter([&] {
    char sig = 0;
    while (read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) fmt::print(stderr, "woq: {}; stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    if (ranks.size() > 1) {
      // A rank that stopped answering (SIGSTOP, a network partition) would hold rank 0's engine in its pass, and
      // this process in the engine's end, for ever: the job ends instead, 10 s after the drain's time is up.
      const auto grace = std::chrono::duration<double>(a.shutdown_timeout + 10);
      std::thread([&ranks, grace] {
        std::this_thread::sleep_for(grace);
        fmt::print(stderr, "woq: error (rank 0 of {}): the pipeline's ranks did not finish {:.0f} s after the stop "
                   "(a rank stopped answering); ending the job\n", ranks.size(), grace.count());
        std::fflush(stderr);
        ranks.abort(1);
      }).detach();
    }
    server.stop();
  });
  server.serve();
  const char wake = 0;  // serve() also returns when listening fails: release the waiter
  [[maybe_unused]] const auto n = write(stop_pipe[1], &wake, 1);
  waiter.join();
  return 0;
}

}  // namespace

Run add_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI API (/v1/completions, /v1/chat/completions) with continuous batching");
  add_model_and_low_bit(cmd, args->model_dir, args->low_bit);
  add_model_flags(cmd, args->model);
  cmd->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "Port (0 = any free port, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", args->parallel, "Sequences decoded together (continuous batching)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("-c,--ctx-size", args->ctx_size, "Tokens per sequence, prompt included; 0 = the model's context")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("--served-model-name", args->served_model_name, "Model name for clients (default: the model directory's or .gguf file's name)");
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--shutdown-timeout", args->shutdown_timeout,
                  "Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are cancelled")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--max-queue", args->max_queue, "Requests waiting for a sequence slot at most; more get a 503")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Prompt tokens prefilled per step between the decode steps of running sequences (chunked prefill); "
                  "0 = each prompt whole; -1 = as many as take about 3/4 of a decode step (the streams' time per "
                  "output token stays under 2x)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 30));
  cmd->add_option("--cache-gb", args->cache_gb,
                  "Memory for the prefix cache (KV of earlier prompts, reused by prompts that start the same); 0 = off; "
                  "default: what the memory budget leaves beside the --parallel caches, at most as much as they take; a size "
                  "given is taken from the budget first; -1 = that default")
      ->capture_default_str()
      ->check(CLI::Range(-1.0, 1048576.0));
  cmd->add_option("--max-prompt-bytes", args->max_prompt_bytes,
                  "A prompt's (or chat messages') bytes at most; more is a 400. Bounds the time one request spends "
                  "tokenizing")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  cmd->add_option("--max-connections", args->max_connections, "Open connections at most; more get a 503")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  return [args] { return run_serve(*args); };
}

}  // namespace woq::cli
