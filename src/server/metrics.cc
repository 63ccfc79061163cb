#include "server/metrics.h"

#include <fmt/format.h>

namespace woq::server {

void Histogram::observe(double seconds) {
  for (std::size_t i = 0; i < kBounds.size(); ++i)
    if (seconds <= kBounds[i]) ++counts_[i];
  ++count_;
  sum_ += seconds;
}

std::string Histogram::text(const std::string& name) const {
  std::string out;
  for (std::size_t i = 0; i < kBounds.size(); ++i) out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return out;
}

void Metrics::request(bool ok) {
  std::lock_guard lock(mu_);
  ++requests_;
  if (!ok) ++errors_;
}

void Metrics::tokens(std::int64_t prompt, std::int64_t completion) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += static_cast<std::uint64_t>(prompt);
  completion_tokens_ += static_cast<std::uint64_t>(completion);
}

void Metrics::first_token(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds) {
  std::lock_guard lock(mu_);
  itl_.observe(seconds);
}

void Metrics::cancelled() {
  std::lock_guard lock(mu_);
  ++cancelled_;
}

void Metrics::set_load(std::int64_t queued, std::int64_t active) {
  std::lock_guard lock(mu_);
  queued_ = queued;
  active_ = active;
}

void Metrics::prefix_hit(std::int64_t tokens) {
  std::lock_guard lock(mu_);
  hit_tokens_ += static_cast<std::uint64_t>(tokens);
}

void Metrics::set_prefix_cache_bytes(std::int64_t bytes) {
  std::lock_guard lock(mu_);
  prefix_cache_bytes_ = bytes;
}

std::int64_t Metrics::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

std::int64_t Metrics::active() const {
  std::lock_guard lock(mu_);
  return active_;
}

std::string Metrics::text() const {
  std::lock_guard lock(mu_);
  std::string out;
  auto counter = [&](const char* name, const char* help, std::uint64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
  };
  auto gauge = [&](const char* name, const char* help, std::int64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, v);
  };
  counter("woq_requests_total", "API requests answered.", requests_);
  counter("woq_request_errors_total", "API requests answered with an error.", errors_);
  counter("woq_prompt_tokens_total", "Prompt tokens processed.", prompt_tokens_);
  counter("woq_completion_tokens_total", "Tokens generated.", completion_tokens_);
  counter("woq_prefix_cache_hit_tokens_total", "Prompt tokens reused from the prefix cache, not prefilled.", hit_tokens_);
  counter("woq_cancelled_total", "Generations cancelled by a client that went away.", cancelled_);
  gauge("woq_queue_depth", "Requests waiting for a sequence slot.", queued_);
  gauge("woq_active_sequences", "Sequences prefilling or decoding now.", active_);
  gauge("woq_prefix_cache_bytes", "KV cache bytes the prefix cache holds.", prefix_cache_bytes_);
  out += "# HELP woq_time_to_first_token_seconds From request to first generated token.\n"
         "# TYPE woq_time_to_first_token_seconds histogram\n";
  out += ttft_.text("woq_time_to_first_token_seconds");
  out += "# HELP woq_time_per_output_token_seconds Between consecutive generated tokens.\n"
         "# TYPE woq_time_per_output_token_seconds histogram\n";
  out += itl_.text("woq_time_per_output_token_seconds");
  return out;
}

}  // namespace woq::server
