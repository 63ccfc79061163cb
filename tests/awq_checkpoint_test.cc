// `woq quantize --format awq`: AutoAWQ's GEMM layout written from a float
// model, read back as the model woq quantizes in memory (bit for bit), with the
// layers AWQ cannot pack kept float and named in modules_to_not_convert. The
// reader itself is checked against an independent NumPy packer
// (tests/python/test_awq.py) and AutoAWQ's words (checkpoint_packing_test).
#include <gtest/gtest.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"
#include "io/quantized_checkpoint.h"
#include "model/llama.h"
#include "model/random_checkpoint.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/quantize_request.h"
#include "test_files.h"

namespace woq {
namespace {

using test::TempDir;

using test::error_of;

std::vector<float> logits_of(LlamaModel& m) {
  KVCache cache = m.make_cache(16);
  std::vector<float> logits;
  m.forward(std::vector<std::int32_t>{1, 403, 407, 261, 378, 9, 300}, cache, true, logits);
  return logits;
}

// `woq quantize -m in -o out --format awq`.
QuantizeRequest awq_request(const std::string& in, const std::string& out) {
  QuantizeRequest r;
  r.input = in;
  r.output = out;
  r.format = "awq";
  return r;
}

// The AWQ checkpoint of `in` (RTN or GPTQ) loads as the in-memory model of the same plan: the same logits.
void expect_awq_is_in_memory(const std::string& in, const std::string& low_bit, std::int64_t group,
                             const std::string& method = "rtn") {
  ThreadPool pool(2);
  TempDir tmp;
  QuantizeRequest r = awq_request(in, tmp.file("awq"));
  r.low_bit = low_bit;
  r.group_size = group;
  r.method = method;
  if (method != "rtn") r.calib = "random:4x32";
  run_quantize_request(r, pool, {});
  const auto q = read_quantization_config(r.output);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->method, QuantizationConfig::Method::kAwq);
  EXPECT_EQ(q->group_size, group);
  const ModelConfig c = read_model_config(in);
  auto plan = std::make_shared<QuantPlan>(awq_plan({parse_low_bit(low_bit), group}, c, LowBit::kFp32));
  EXPECT_EQ(q->not_converted.size(), plan->tensors.size());
  LoadOptions as_stored;
  as_stored.linear_is_default = true;
  auto awq = LlamaModel::load(r.output, as_stored, pool);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& s : kBlockLinears)
      EXPECT_EQ(awq->block_linear(l, s.role).type,
                is_quantized(plan->linear(l, s.role).type) ? LowBit::kAsymInt4 : LowBit::kFp32);
  if (method != "rtn") return;  // GPTQ's integers are its own; the layout and types are what is checked
  LoadOptions in_memory;
  in_memory.linear = plan->base;
  in_memory.plan = plan;
  auto m = LlamaModel::load(in, in_memory, pool);
  EXPECT_EQ(logits_of(*awq), logits_of(*m));
}

TEST(AwqCheckpoint, BundledModelWithItsMlpKeptFloat) {
  expect_awq_is_in_memory(WOQ_MODEL_DIR, "asym_int4", 32);  // intermediate 172: N % 8 != 0
  // gate and up both float: "...mlp.gate" also matches vLLM's fused gate_up_proj (a substring match).
  const QuantizationConfig qc =
      awq_plan_config(awq_plan({LowBit::kAsymInt4, 32}, read_model_config(WOQ_MODEL_DIR), LowBit::kFp32),
                      read_model_config(WOQ_MODEL_DIR));
  EXPECT_EQ(qc.not_converted[0], "model.layers.0.mlp.gate");
  EXPECT_EQ(qc.not_converted[1], "model.layers.0.mlp.up_proj");
  EXPECT_FALSE(qc.for_module("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(qc.for_module("model.layers.0.self_attn.q_proj"));
  expect_awq_is_in_memory(WOQ_MODEL_DIR, "sym_int4", 64);
}

TEST(AwqCheckpoint, EveryLayerOfAModelAwqCanPack) {
  TempDir tmp;
  ThreadPool pool(2);
  RandomCheckpointOptions r;
  r.preset = "tiny";  // hidden 128, intermediate 344 = 43 x 8
  r.seed = 9;
  r.dtype = DType::kF32;
  write_random_checkpoint(tmp.file("random"), r, pool);
  expect_awq_is_in_memory(tmp.file("random"), "asym_int4", 8);
  expect_awq_is_in_memory(WOQ_MODEL_DIR, "asym_int4", 32, "gptq");
  expect_awq_is_in_memory(WOQ_MODEL_DIR, "asym_int4", 32, "awq");  // the MLP kept float, scaled as folded
}

TEST(AwqCheckpoint, WhatAwqCannotHoldIsRefused) {
  ThreadPool pool(2);
  TempDir tmp;
  QuantizeRequest r = awq_request(WOQ_MODEL_DIR, tmp.file("awq"));
  r.low_bit = "sym_int8";
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("asym_int4 (AWQ's) or sym_int4"), std::string::npos);
  r.low_bit.reset();
  r.group_size = -1;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("needs a group size"), std::string::npos);
  r.group_size = 128;  // K = 64 everywhere but down_proj, 172 there: nothing fits
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("no linear layer fits AWQ's packing"),
            std::string::npos);
  r.group_size.reset();
  r.desc_act = true;
  r.method = "gptq";
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("no g_idx"), std::string::npos);
}

}  // namespace
}  // namespace woq
