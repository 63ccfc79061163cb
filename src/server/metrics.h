// Server counters and latency histograms in the Prometheus text format
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace woq::server {

/// A cumulative histogram with fixed upper bounds in seconds.
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1.0,  2.5,   10.0};
  void observe(double seconds);
  /// "NAME_bucket{le=...} n" lines, NAME_sum and NAME_count.
  std::string text(const std::string& name) const;

 private:
  std::array<std::uint64_t, kBounds.size()> counts_{};
  std::uint64_t count_ = 0;
  double sum_ = 0;
};

/// Everything /metrics reports. Thread-safe.
class Metrics {
 public:
  void request(bool ok);                 ///< an API request answered (ok: 2xx)
  void tokens(std::int64_t prompt, std::int64_t completion);
  void first_token(double seconds);      ///< submit to first generated token
  void inter_token(double seconds);      ///< between consecutive generated tokens
  void cancelled();
  void set_load(std::int64_t queued, std::int64_t active);
  /// Prompt tokens a request took from the prefix cache instead of prefilling them.
  void prefix_hit(std::int64_t tokens);
  /// KV bytes the prefix cache holds now.
  void set_prefix_cache_bytes(std::int64_t bytes);
  std::int64_t active() const;
  std::int64_t queued() const;  ///< requests waiting for a slot (woq_queue_depth)
  /// The Prometheus exposition text.
  std::string text() const;

 private:
  mutable std::mutex mu_;
  std::uint64_t requests_ = 0, errors_ = 0, prompt_tokens_ = 0, completion_tokens_ = 0, cancelled_ = 0, hit_tokens_ = 0;
  std::int64_t queued_ = 0, active_ = 0, prefix_cache_bytes_ = 0;
  Histogram ttft_, itl_;
};

}  // namespace woq::server
