// The transformer's element-wise and row-wise operations (kernels/ops.h) against float64 references of the
// formulas they implement (HF LlamaRMSNorm, rotate_half RoPE, softmax, SiLU-gated linear unit), on inputs that
// make each detail matter: eps against small rows, large positions, logits far from zero, saturated gates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace woq {
namespace {

std::vector<float> normal(std::mt19937& rng, std::size_t n, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// |got - want| <= rel * |want| + abs, element by element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + abs) << what << " at " << i;
}

TEST(Ops, RmsNormMatchesFloat64) {
  std::mt19937 rng(1);
  // Rows of typical size, of a large scale (squares that a float sum would round), and small enough that eps
  // (inside the square root) changes the result by a quarter.
  for (const float scale : {1.0f, 300.0f, 3e-3f}) {
    for (const std::int64_t n : {1, 7, 4096}) {
      const std::vector<float> x = normal(rng, static_cast<std::size_t>(n), scale);
      const std::vector<float> w = normal(rng, static_cast<std::size_t>(n), 1.0f);
      const float eps = 1e-5f;
      double ss = 0;
      for (const float v : x) ss += static_cast<double>(v) * v;
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps));
      std::vector<double> want(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] * inv * w[i];
      std::vector<float> out(x.size());
      rms_norm(x.data(), w.data(), n, eps, out.data());
      expect_close(out, want, 2e-6, 1e-30, "rms_norm");
      std::vector<float> in_place = x;  // out may alias x
      rms_norm(in_place.data(), w.data(), n, eps, in_place.data());
      EXPECT_EQ(in_place, out);
    }
  }
}

TEST(Ops, RopeMatchesRotateHalfInFloat64) {
  std::mt19937 rng(2);
  for (const std::int64_t head_dim : {2, 64, 128}) {
    const std::int64_t heads = 3, half = head_dim / 2;
    std::vector<float> inv_freq(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      inv_freq[static_cast<std::size_t>(i)] =
          static_cast<float>(std::pow(500000.0, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    for (const std::int64_t pos : {0, 1, 17, 4095, 131071}) {
      const std::vector<float> x = normal(rng, static_cast<std::size_t>(heads * head_dim), 1.0f);
      // transformers: the angle pos * inv_freq is a float32 product; cos and sin of it here in float64.
      std::vector<double> want(x.size());
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<float>(pos) * inv_freq[static_cast<std::size_t>(i)];
          const double a = x[static_cast<std::size_t>(h * head_dim + i)];
          const double b = x[static_cast<std::size_t>(h * head_dim + i + half)];
          want[static_cast<std::size_t>(h * head_dim + i)] = a * std::cos(angle) - b * std::sin(angle);
          want[static_cast<std::size_t>(h * head_dim + i + half)] = b * std::cos(angle) + a * std::sin(angle);
        }
      std::vector<float> got = x;
      rope(got.data(), heads, head_dim, pos, inv_freq.data());
      expect_close(got, want, 1e-5, 2e-6, "rope");
    }
  }
}

TEST(Ops, SoftmaxMatchesFloat64) {
  std::mt19937 rng(3);
  for (const float spread : {0.5f, 20.0f}) {
    for (const float offset : {0.0f, 1e4f, -1e4f}) {  // exp of the raw logits would overflow or vanish
      for (const std::int64_t n : {1, 5, 32000}) {
        std::vector<float> x = normal(rng, static_cast<std::size_t>(n), spread);
        for (float& v : x) v += offset;
        double max = x[0], sum = 0;
        for (const float v : x) max = std::max(max, static_cast<double>(v));
        std::vector<double> want(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) sum += want[i] = std::exp(x[i] - max);
        for (double& v : want) v /= sum;
        softmax(x.data(), n);
        expect_close(x, want, 1e-4, 1e-9, "softmax");
      }
    }
  }
}

TEST(Ops, SwigluMatchesFloat64) {
  std::mt19937 rng(4);
  std::vector<float> gate = normal(rng, 4096, 6.0f);
  gate.insert(gate.end(), {-100.0f, -88.0f, 0.0f, 88.0f, 100.0f});  // saturated: e^-v overflows or vanishes
  const std::vector<float> up = normal(rng, gate.size(), 2.0f);
  std::vector<double> want(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) want[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
  swiglu(gate.data(), up.data(), static_cast<std::int64_t>(gate.size()));
  expect_close(gate, want, 1e-6, 1e-30, "swiglu");
}

}  // namespace
}  // namespace woq
