#include "quantize/gptq_calibration.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/mmap_file.h"
#include "kernels/blas.h"

namespace woq {

namespace {

std::size_t idx(LinearRole role) { return static_cast<std::size_t>(role); }

// The first block linear reading `role`'s input: linears sharing an input share one Hessian, observed once.
LinearRole input_owner(LinearRole role) {
  for (const LinearSpec& s : kBlockLinears)
    if (s.input == linear_spec(role).input) return s.role;
  return role;
}

// GPTQ's stages: one per input in true-sequential order (q/k/v, o, gate/up, down: each stage sees the
// quantized outputs of the ones before), else one stage of every linear.
std::vector<std::vector<LinearRole>> gptq_stages(bool true_sequential) {
  std::vector<std::vector<LinearRole>> stages;
  for (const LinearSpec& s : kBlockLinears) {
    if (stages.empty() || (true_sequential && linear_spec(stages.back().front()).input != s.input))
      stages.emplace_back();
    stages.back().push_back(s.role);
  }
  return stages;
}

}  // namespace

Calibration random_calibration(std::int64_t count, std::int64_t length, std::int64_t vocab, std::uint64_t seed) {
  if (count < 1 || length < 1 || vocab < 1)
    fail("random calibration needs positive sizes, got {} x {} over a vocabulary of {}", count, length, vocab);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(vocab - 1));
  Calibration out(static_cast<std::size_t>(count));
  for (auto& seq : out) {
    seq.resize(static_cast<std::size_t>(length));
    for (auto& t : seq) t = id(rng);
  }
  return out;
}

Calibration text_calibration(const Tokenizer& tokenizer, const std::string& text, std::int64_t count,
                             std::int64_t length) {
  if (count < 1 || length < 1) fail("text calibration needs positive sizes, got {} x {}", count, length);
  const std::vector<std::int32_t> ids = tokenizer.encode(text);
  if (static_cast<std::int64_t>(ids.size()) / count < length)
    fail("the calibration text has {} tokens; {} windows of {} need {}", ids.size(), count, length, count * length);
  Calibration out;
  for (std::int64_t i = 0; i < count; ++i)
    out.emplace_back(ids.begin() + i * length, ids.begin() + (i + 1) * length);
  return out;
}

GptqMemory gptq_memory(const ModelConfig& c, std::int64_t count, std::int64_t length, std::uint64_t resident_bytes) {
  const auto f = [](std::int64_t a, std::int64_t b) { return static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b); };
  GptqMemory m;
  m.resident = resident_bytes;
  for (const LinearSpec& s : kBlockLinears) {
    const auto [rows, cols] = block_linear_shape(c, s.role);
    m.block_weights += 4 * f(rows, cols);
  }
  // The hidden states of every sequence, one sequence's copy and the forward's scratch of one sequence.
  const std::int64_t per_token = 2 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size +
                                 c.hidden_size;
  m.activations = 4 * f(count * length, c.hidden_size) + 4 * f(length, per_token) + 4 * f(length, c.hidden_size);
  // fp32 sums of X^T X of the inputs fitted at once (q/k/v, o, gate/up share theirs; down reads intermediate), the
  // f64 matrix and inverse factor of the largest, and GPTQ's f64 copy of the largest weight.
  const std::int64_t big = std::max(c.intermediate_size, std::max(c.hidden_size, c.q_dim()));
  m.hessians = 4 * (2 * f(c.hidden_size, c.hidden_size) + f(c.q_dim(), c.q_dim()) + f(c.intermediate_size, c.intermediate_size)) +
               2 * 8 * f(big, big) + 8 * f(c.intermediate_size, c.hidden_size) + f(c.intermediate_size, c.hidden_size);
  return m;
}

void check_gptq_memory(const GptqMemory& m, std::int64_t count, std::int64_t length) {
  const std::optional<std::int64_t> available = available_memory_bytes();
  if (!available || static_cast<double>(m.total()) <= 0.9 * static_cast<double>(*available)) return;
  const auto gib = [](double b) { return b / (1u << 30); };
  fail("GPTQ of {} x {} calibration tokens needs about {:.1f} GiB at its peak (one decoder block in fp32 {:.1f}, "
       "calibration activations {:.1f}, Hessians {:.1f}, embeddings and lm_head {:.1f}); {:.1f} GiB are available. Use "
       "fewer or shorter calibration sequences (--nsamples / --seqlen, or --calib random:NxL)",
       count, length, gib(static_cast<double>(m.total())), gib(static_cast<double>(m.block_weights)),
       gib(static_cast<double>(m.activations)), gib(static_cast<double>(m.hessians)), gib(static_cast<double>(m.resident)),
       gib(static_cast<double>(*available)));
}

std::unique_ptr<LlamaModel> load_for_calibration(const std::string& dir, ThreadPool& pool, LoadReport* report) {
  LoadOptions options;
  options.block_linears = false;  // gptq_block_quantizer streams them, one block at a time
  return LlamaModel::load(dir, options, pool, report);
}

const TensorView& read_float_linear(const TensorStore& store, const ModelConfig& c, std::int64_t layer, LinearRole role,
                                   std::vector<float>& out, bool values) {
  const TensorView& t = store.get(linear_tensor(layer, role));
  const auto [rows, cols] = block_linear_shape(c, role);
  require_shape(t, {rows, cols}, shape_source(t));
  require_float_dtype(t);
  out.resize(static_cast<std::size_t>(rows * cols));
  if (!values) return t;
  tensor_to_f32(t, out.data());
  release_pages(t.bytes);
  // As RTN and the GGUF export refuse them: GPTQ or AWQ would spread a NaN's error over the whole row.
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(out[i]))
      fail("{}: tensor '{}' holds {} at row {}, column {}", t.file, t.name, out[i], static_cast<std::int64_t>(i) / cols,
           static_cast<std::int64_t>(i) % cols);
  return t;
}

BlockQuantizer gptq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                    const GptqOptions& options, bool true_sequential, ThreadPool& pool,
                                    const std::function<void(const GptqTimes&)>& on_layer, ResumeDir* resume) {
  if (calibration.empty()) fail("GPTQ needs calibration data");
  const ModelConfig& config = model.config();
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t length = static_cast<std::int64_t>(calibration.front().size());
  // Hidden states entering the next block, one buffer per sequence.
  auto states = std::make_shared<std::vector<std::vector<float>>>();
  for (const auto& seq : calibration) {
    if (static_cast<std::int64_t>(seq.size()) != length) fail("calibration sequences must have equal lengths");
    states->emplace_back(static_cast<std::size_t>(length * hidden));
    model.embed(seq, states->back().data());
  }
  return [&model, &store, states, options, true_sequential, &pool, length, on_layer, resume](std::int64_t layer) {
    using Clock = std::chrono::steady_clock;
    const auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    GptqTimes times;
    times.layer = layer;
    const ModelConfig& c = model.config();
    // A block finished before an interruption is not read: its stored integers stand for it.
    const auto finished = [&](std::int64_t l) { return resume != nullptr && l < resume->completed(); };
    const bool done = finished(layer);
    auto t0 = Clock::now();
    // The next block's weights are read from the file in the background while this one computes.
    if (layer + 1 < c.num_hidden_layers && !finished(layer + 1))
      for (const LinearSpec& s : kBlockLinears)
        if (const TensorView* next = store.find(linear_tensor(layer + 1, s.role))) prefetch_pages(next->bytes);
    // This block's weights in fp32, read from the checkpoint and released; each is replaced by its quantized
    // values (dequantized) once GPTQ has fitted it, so that what comes after sees the block as it will run.
    std::array<std::vector<float>, kBlockLinears.size()> w;
    std::array<const TensorView*, kBlockLinears.size()> tensors{};
    for (const LinearSpec& s : kBlockLinears)
      tensors[idx(s.role)] = &read_float_linear(store, c, layer, s.role, w[idx(s.role)], !done);
    // y = x W^T by sgemm.
    const LlamaModel::LinearCompute compute = [&](LinearRole role, const float* x, std::int64_t rows, float* y) {
      const auto [n, k] = block_linear_shape(c, role);
      parallel_sgemm_nt(pool, rows, n, k, x, w[idx(role)].data(), y);
    };
    const auto use_quantized = [&](LinearRole role, const QuantMatrix& q) {  // w[role] = the values q stands for
      const std::int64_t k = block_linear_shape(c, role).second;
      std::vector<float>& wi = w[idx(role)];
      pool.parallel_for(q.rows, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) dequantize_row(q, r, wi.data() + r * k);
      });
    };
    const auto advance_states = [&] {
      const auto f0 = Clock::now();
      for (auto& state : *states) model.forward_block(layer, state.data(), length, nullptr, compute);
      times.forward += seconds_since(f0);
    };
    if (done) {
      std::vector<QuantMatrix> block = resume->load_block(layer);
      for (const LinearSpec& s : kBlockLinears) use_quantized(s.role, block[idx(s.role)]);
      advance_states();
      return QuantizedBlock{std::move(block), {}};
    }
    times.read = seconds_since(t0);
    std::vector<QuantMatrix> out(kBlockLinears.size());
    std::vector<float> x;
    for (const std::vector<LinearRole>& stage : gptq_stages(true_sequential)) {
      std::map<LinearRole, Hessian> hessians;  // by input_owner
      for (const LinearRole role : stage) hessians.try_emplace(input_owner(role), block_linear_shape(c, role).second);
      double hessian_seconds = 0;
      const LlamaModel::LinearObserver observe = [&](LinearRole role, const float* in, std::int64_t rows) {
        const auto it = hessians.find(role);
        if (it == hessians.end()) return;
        const auto h0 = Clock::now();
        it->second.add(in, rows, &pool);
        hessian_seconds += seconds_since(h0);
      };
      // The copy's output is dropped: down_proj's product is not needed, only its input.
      const LlamaModel::LinearCompute inputs_only = [&](LinearRole role, const float* in, std::int64_t rows, float* y) {
        if (role != LinearRole::kDown) compute(role, in, rows, y);
      };
      t0 = Clock::now();
      for (const auto& state : *states) {
        x = state;
        model.forward_block(layer, x.data(), length, observe, inputs_only);
      }
      times.hessian += hessian_seconds;
      times.forward += seconds_since(t0) - hessian_seconds;
      t0 = Clock::now();
      // One prepared Hessian alive at a time (the largest is [intermediate, intermediate] f64).
      GptqHessian prepared;
      std::optional<LinearRole> prepared_for;
      for (const LinearRole role : stage) {
        if (input_owner(role) != prepared_for) {
          prepared_for = input_owner(role);
          prepared = GptqHessian{};
          Hessian& h = hessians.at(*prepared_for);
          prepared = prepare_gptq(h.matrix(), h.k(), options, pool.size());
          h = Hessian(1);  // frees its sums
        }
        const auto [n, k] = block_linear_shape(c, role);
        std::vector<float>& wi = w[idx(role)];
        GptqOptions linear = options;
        if (options.plan) linear.spec = options.plan->linear(layer, role);
        try {
          out[idx(role)] = is_quantized(linear.spec.type)
                               ? gptq_quantize(wi.data(), n, k, prepared, linear, pool)
                               : quantize_matrix(wi.data(), n, k, linear.spec, &pool);  // a layer the plan keeps float
        } catch (const Error& e) {
          fail("{}: tensor '{}': {}", tensors[idx(role)]->file, tensors[idx(role)]->name, e.what());
        }
        use_quantized(role, out[idx(role)]);
      }
      times.solve += seconds_since(t0);
    }
    advance_states();
    t0 = Clock::now();
    if (resume != nullptr) resume->save_block(layer, out);
    times.save = seconds_since(t0);
    if (on_layer) on_layer(times);
    return QuantizedBlock{std::move(out), {}};
  };
}

}  // namespace woq
