#include "quantize/gptq_calibration.h"

#include <map>
#include <memory>
#include <random>

#include <unistd.h>

#include <fmt/format.h>

#include "core/error.h"
#include "core/mmap_file.h"
#include "kernels/matmul.h"

namespace woq {

namespace {

// Block linears sharing one input (and so one Hessian): the first of each set.
constexpr int kInputOf[7] = {0, 0, 0, 3, 4, 4, 6};

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

void check_calibration_memory(std::int64_t count, std::int64_t length, std::int64_t hidden) {
  const double bytes = 4.0 * static_cast<double>(count) * static_cast<double>(length) * static_cast<double>(hidden);
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (bytes > 0.75 * ram)
    fail("calibration of {} x {} tokens needs {:.1f} GiB of fp32 activations (hidden {}); this machine has {:.1f} GiB",
         count, length, bytes / (1u << 30), hidden, ram / (1u << 30));
}

std::unique_ptr<LlamaModel> load_for_calibration(const std::string& dir, ThreadPool& pool) {
  const TensorStore store = TensorStore::open(dir);
  const TensorView& probe = store.get("model.layers.0.self_attn.q_proj.weight");
  LoadOptions options;
  options.linear.type = probe.dtype == DType::kF16 ? LowBit::kFp16 : probe.dtype == DType::kBF16 ? LowBit::kBf16 : LowBit::kFp32;
  return LlamaModel::load(dir, options, pool);
}

BlockQuantizer gptq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                    const GptqOptions& options, bool true_sequential, ThreadPool& pool) {
  if (calibration.empty()) fail("GPTQ needs calibration data");
  const std::int64_t hidden = model.config().hidden_size;
  const std::int64_t length = static_cast<std::int64_t>(calibration.front().size());
  check_calibration_memory(static_cast<std::int64_t>(calibration.size()), length, hidden);
  // Hidden states entering the next block, one buffer per sequence.
  auto states = std::make_shared<std::vector<std::vector<float>>>();
  for (const auto& seq : calibration) {
    if (static_cast<std::int64_t>(seq.size()) != length) fail("calibration sequences must have equal lengths");
    states->emplace_back(static_cast<std::size_t>(length * hidden));
    model.embed(seq, states->back().data());
  }
  return [&model, &store, states, options, true_sequential, &pool, length](std::int64_t layer) {
    const std::vector<std::vector<int>> stages =
        true_sequential ? std::vector<std::vector<int>>{{0, 1, 2}, {3}, {4, 5}, {6}}
                        : std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6}};
    std::vector<QuantMatrix> out(7);
    std::vector<float> x;
    for (const auto& stage : stages) {
      std::map<int, Hessian> hessians;  // by kInputOf
      for (const int i : stage) hessians.try_emplace(kInputOf[i], model.block_linear(layer, i).cols);
      const LlamaModel::LinearObserver observe = [&](int i, const float* in, std::int64_t rows) {
        const auto it = hessians.find(i);
        if (it != hessians.end()) it->second.add(in, rows);
      };
      for (const auto& state : *states) {
        x = state;
        model.forward_block(layer, x.data(), length, observe);
      }
      // One prepared Hessian alive at a time (the largest is [intermediate, intermediate] f64).
      GptqHessian prepared;
      int prepared_for = -1;
      for (const int i : stage) {
        if (kInputOf[i] != prepared_for) {
          prepared_for = kInputOf[i];
          prepared = GptqHessian{};
          Hessian& h = hessians.at(prepared_for);
          prepared = prepare_gptq(h.matrix(), h.k(), options);
          h = Hessian(1);  // frees its sums
        }
        const TensorView& t = store.get(fmt::format("model.layers.{}.{}.weight", layer, kBlockLinears[i]));
        require_float_dtype(t);
        std::vector<float> w(static_cast<std::size_t>(t.numel()));
        tensor_to_f32(t, w.data());
        release_pages(t.bytes);
        try {
          out[static_cast<std::size_t>(i)] =
              gptq_quantize(w.data(), t.shape[0], t.shape[1], prepared, options, pool);
        } catch (const Error& e) {
          fail("{}: tensor '{}': {}", t.file, t.name, e.what());
        }
        QuantMatrix& in_model = model.block_linear(layer, i);
        in_model = out[static_cast<std::size_t>(i)];
        // The later layers see this one as a loaded checkpoint would run it.
        in_model.activations = default_activations(in_model.type);
        prepare_for_kernels(in_model, &pool);
      }
    }
    for (auto& state : *states) model.forward_block(layer, state.data(), length, nullptr);
    return out;
  };
}

}  // namespace woq
