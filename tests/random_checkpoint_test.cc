// The safetensors writer and `woq make-random`'s checkpoints: readable by
// woq's own loader, deterministic, sharded correctly, shaped like the preset.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "io/json_file.h"
#include "io/safetensors_writer.h"
#include "model/llama.h"
#include "model/random_checkpoint.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

TEST(SafetensorsWriter, RoundTripsThroughTheReader) {
  test::TempDir dir;
  const std::vector<TensorSpec> specs = {{"a", DType::kF32, {3, 5}}, {"b.c", DType::kF16, {7}}, {"d", DType::kI32, {2, 2, 2}}};
  auto fill = [&](std::size_t i, std::span<std::uint8_t> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<std::uint8_t>(i * 31 + j * 7);
  };
  write_safetensors(dir.file("x.safetensors"), specs, fill);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.safetensors.tmp")));
  const SafetensorsFile f(dir.file("x.safetensors"));
  ASSERT_EQ(f.tensors().size(), 3u);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TensorView& t = f.tensors().at(specs[i].name);
    EXPECT_EQ(t.dtype, specs[i].dtype);
    EXPECT_EQ(t.shape, specs[i].shape);
    std::vector<std::uint8_t> want(specs[i].bytes());
    fill(i, want);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), t.bytes.begin(), t.bytes.end())) << specs[i].name;
  }
}

std::vector<float> logits_of(const std::string& dir) {
  ThreadPool pool(2);
  auto model = LlamaModel::load(dir, LoadOptions{{LowBit::kFp32, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}, pool);
  KVCache cache = model->make_cache(8);
  std::vector<float> logits;
  const std::vector<std::int32_t> ids = {1, 50, 300, 7};
  model->forward(ids, cache, true, logits);
  return logits;
}

TEST(RandomCheckpoint, DeterministicShardedAndLoadable) {
  test::TempDir one, sharded, again;
  ThreadPool pool1(1), pool2(2);
  RandomCheckpointOptions opt;
  opt.preset = "tiny";
  opt.seed = 7;
  write_random_checkpoint(one.path(), opt, pool1);
  write_random_checkpoint(again.path(), opt, pool2);  // other thread count, same bytes
  EXPECT_EQ(test::read_file(one.file("model.safetensors")), test::read_file(again.file("model.safetensors")));
  opt.max_shard_bytes = 200 * 1024;
  write_random_checkpoint(sharded.path(), opt, pool2);
  EXPECT_FALSE(std::filesystem::exists(sharded.file("model.safetensors")));
  const auto index = read_json_file(sharded.file("model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const auto& f : shards) {
    EXPECT_TRUE(std::filesystem::exists(sharded.file(f))) << f;
    EXPECT_LE(std::filesystem::file_size(sharded.file(f)), 200u * 1024 + 4096) << f;
  }
  EXPECT_EQ(logits_of(one.path()), logits_of(sharded.path()));

  // The weights look like N(0, 0.02), not zeros.
  const SafetensorsFile f(one.file("model.safetensors"));
  const TensorView& q = f.tensors().at("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> v(static_cast<std::size_t>(q.numel()));
  tensor_to_f32(q, v.data());
  double mean = 0, var = 0;
  for (const float x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (const float x : v) var += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(var / static_cast<double>(v.size())), 0.02, 0.001);
}

// Each preset against an independent source: the real tokenizer it is written with (the model's own
// vocabulary: vocab_size covers it, padded by at most 2 % as Qwen's are); a name that is none throws.
TEST(RandomCheckpoint, PresetVocabulariesFitTheirTokenizers) {
  for (const ModelPreset& p : model_presets()) {
    if (p.tokenizer == "stories") continue;
    const Tokenizer tok = Tokenizer::load(std::string(WOQ_ASSETS_DIR) + "/tokenizers/" + p.tokenizer);
    EXPECT_LE(tok.vocab_size(), p.config.vocab_size) << p.name;
    EXPECT_GE(tok.vocab_size(), p.config.vocab_size * 98 / 100) << p.name;
  }
  EXPECT_THROW(find_preset("gpt-5"), Error);
}

}  // namespace
}  // namespace woq
