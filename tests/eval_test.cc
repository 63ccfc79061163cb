// Perplexity against an independent f64 NumPy forward pass, and the
// invariants of perplexity and model comparison.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/compare.h"
#include "eval/explain.h"
#include "eval/perplexity.h"
#include "eval/recovery.h"
#include "io/json_file.h"
#include "model/random_checkpoint.h"
#include "test_files.h"

namespace woq {
namespace {

const QuantSpec kFp32{LowBit::kFp32, 32, Int4Range::kFull};

std::vector<double> nll_of(LlamaModel& model, const ScoringPlan& plan) {
  std::vector<double> nll;
  const std::int64_t vocab = model.config().vocab_size;
  run_plan(model, plan, 0, [&](std::int64_t, std::int64_t, std::int32_t target, const float* logits) {
    nll.push_back(token_nll(logits, vocab, target));
  });
  return nll;
}

TEST(Perplexity, MatchesF64NumpyReference) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const std::string text = read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt");
  for (const bool per_document : {false, true}) {
    const ScoringPlan plan = per_document ? document_plan(tok, text, "<|endoftext|>", 128, 4)
                                          : chunk_plan(tok.encode(text), 128, 4, tok.bos_id());
    test::TempDir tmp;
    test::write_file(tmp.file("plan.json"),
                     nlohmann::json{{"sequences", plan.sequences}, {"first_scored", plan.first_scored}}.dump());
    const std::string python = test::python();
    const std::string cmd = python + " " WOQ_TEST_SOURCE "/reference/llama_reference.py " WOQ_MODEL_DIR " " + tmp.file("plan.json") +
                            " > " + tmp.file("ref.json") + " 2> " + tmp.file("err");
    const int status = std::system(cmd.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 77 || code == 127) WOQ_SKIP_WITHOUT_REFERENCE(test::python() << " lacks NumPy (bash tools/install-deps.sh)");
    ASSERT_EQ(code, 0) << test::read_file(tmp.file("err"));
    const auto ref = nlohmann::json::parse(test::read_file(tmp.file("ref.json")))["nll"].get<std::vector<double>>();
    auto model = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
    const std::vector<double> nll = nll_of(*model, plan);
    ASSERT_EQ(nll.size(), ref.size());
    ASSERT_EQ(static_cast<std::int64_t>(nll.size()), plan.scored_tokens());
    const double got = perplexity(nll).ppl, want = perplexity(ref).ppl;
    EXPECT_NEAR(got, want, 1e-4 * want) << (per_document ? "per document" : "chunks");
    for (std::size_t i = 0; i < nll.size(); ++i) ASSERT_NEAR(nll[i], ref[i], 2e-3) << i;
  }
}

TEST(Perplexity, ChunkPlanFollowsLlamaPerplexity) {
  std::vector<std::int32_t> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i % 500 + 3);
  const ScoringPlan plan = chunk_plan(tokens, 256, 0, 1);
  ASSERT_EQ(plan.sequences.size(), 3u);  // floor(1000 / 256)
  EXPECT_EQ(plan.first_scored, 128);
  EXPECT_EQ(plan.scored_tokens(), 3 * 127);
  EXPECT_EQ(plan.sequences[1][0], 1);                            // BOS replaces the first token
  EXPECT_EQ(plan.sequences[1][1], tokens[257]);
  EXPECT_EQ(chunk_plan(tokens, 256, 2, -1).sequences.size(), 2u);
  EXPECT_EQ(chunk_plan(tokens, 256, 0, -1).sequences[1][0], tokens[256]);
  try {
    chunk_plan(tokens, 2048, 0, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the text has 1000 tokens, fewer than one chunk of --ctx 2048"), std::string::npos);
  }
}

// llama-perplexity's BOS rule per tokenizer: BOS first in every chunk only when the tokenizer adds one.
TEST(Perplexity, ChunkBosFollowsTheTokenizer) {
  EXPECT_EQ(chunk_bos(Tokenizer::load(WOQ_MODEL_DIR)), 1);                          // SentencePiece, add_bos_token
  EXPECT_EQ(chunk_bos(Tokenizer::load(WOQ_ASSETS_DIR "/tokenizers/qwen3")), -1);    // Qwen adds nothing
  EXPECT_EQ(chunk_bos(Tokenizer::load(WOQ_ASSETS_DIR "/tokenizers/llama3")), -1);   // this file's post-processor adds none
  test::TempDir tmp;
  write_preset_tokenizer(find_preset("tiny-llama3"), tmp.path());                   // TemplateProcessing with BOS
  EXPECT_EQ(chunk_bos(Tokenizer::load(tmp.path())), 128000);
  const Tokenizer qwen = Tokenizer::load(WOQ_ASSETS_DIR "/tokenizers/qwen3");
  std::vector<std::int32_t> tokens(300, 42);
  EXPECT_EQ(chunk_plan(tokens, 100, 0, chunk_bos(qwen)).sequences[1][0], 42);
}

TEST(Perplexity, StandardErrorByHand) {
  const Perplexity p = perplexity({1.0, 2.0, 3.0, 4.0});
  EXPECT_DOUBLE_EQ(p.mean_nll, 2.5);
  EXPECT_DOUBLE_EQ(p.ppl, std::exp(2.5));
  EXPECT_NEAR(p.ppl_stderr, std::exp(2.5) * std::sqrt(1.25 / 3.0), 1e-12);  // population variance 1.25, n - 1 = 3
}

TEST(Perplexity, UniformLogitModelHasPerplexityVocabSize) {
  test::TempDir tmp;
  const std::string dir = tmp.file("uniform");
  test::copy_model(WOQ_MODEL_DIR, dir);
  auto tensors = test::read_safetensors(dir + "/model.safetensors");
  for (auto& t : tensors)
    if (t.name == "model.norm.weight") std::fill(t.bytes.begin(), t.bytes.end(), 0);  // final hidden = 0 -> logits 0
  test::write_safetensors(dir + "/model.safetensors", tensors);
  ThreadPool pool(1);
  auto model = LlamaModel::load(dir, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  const Tokenizer tok = Tokenizer::load(dir);
  const ScoringPlan plan = chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt")), 64, 3, 1);
  const Perplexity p = perplexity(nll_of(*model, plan));
  EXPECT_NEAR(p.ppl, 512.0, 1e-9);
  EXPECT_NEAR(p.ppl_stderr, 0.0, 1e-9);
}

CompareStats compare(const std::string& dir_a, const QuantSpec& a, const QuantSpec& b, const ScoringPlan& plan,
                     const std::string& save_path, std::optional<Activations> activations = std::nullopt) {
  ThreadPool pool(2);
  auto ref_model = LlamaModel::load(dir_a, LoadOptions{a, std::nullopt, std::nullopt, {}}, pool);
  const std::int64_t vocab = ref_model->config().vocab_size;
  RefLogprobFile ref = RefLogprobFile::create(save_path, plan, vocab);
  run_plan(*ref_model, plan, 0, [&](std::int64_t, std::int64_t, std::int32_t, const float* l) { ref.write_logits(l); });
  ref.finish();
  auto cand = LlamaModel::load(dir_a, LoadOptions{b, std::nullopt, activations, {}}, pool);
  CompareAccumulator acc(vocab);
  std::vector<float> row(static_cast<std::size_t>(vocab));
  run_plan(*cand, plan, 0, [&](std::int64_t, std::int64_t, std::int32_t target, const float* l) {
    ref.read(row.data());
    acc.add(row.data(), l, target);
  });
  return acc.result();
}

TEST(Compare, ModelAgainstItselfHasZeroKlAndFullAgreement) {
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const ScoringPlan plan = chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt")), 128, 6, 1);
  const CompareStats s = compare(WOQ_MODEL_DIR, kFp32, kFp32, plan, "");
  EXPECT_EQ(s.positions, plan.scored_tokens());
  EXPECT_EQ(s.mean_kl, 0.0);
  EXPECT_EQ(s.max_kl, 0.0);
  EXPECT_EQ(s.same_top, 1.0);
  EXPECT_EQ(s.ppl_ratio, 1.0);
  EXPECT_EQ(s.rms_dp, 0.0);
  const CompareStats q = compare(WOQ_MODEL_DIR, kFp32, {LowBit::kSymInt4, 32, Int4Range::kFull}, plan, "");
  EXPECT_GT(q.mean_kl, 0.01);
  EXPECT_LT(q.same_top, 1.0);
  EXPECT_GT(q.ppl_ratio, 1.0);
  EXPECT_LE(q.median_kl, q.p90_kl);
  EXPECT_LE(q.p90_kl, q.p99_kl);
  EXPECT_LE(q.p99_kl, q.max_kl);
}

// --activations: int8 activations double sym_int8's error, bf16 ones add little, and neither matters
// for sym_int4 (what the per-format defaults are chosen by); bf16 is the default for sym_int8.
TEST(Compare, ActivationsShareOfTheError) {
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const ScoringPlan plan = chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt")), 256, 12, 1);
  const QuantSpec int8{LowBit::kSymInt8, -1, Int4Range::kFull}, int4{LowBit::kSymInt4, 32, Int4Range::kFull};
  const double i8_i8 = compare(WOQ_MODEL_DIR, kFp32, int8, plan, "", Activations::kInt8).mean_kl;
  const double i8_f32 = compare(WOQ_MODEL_DIR, kFp32, int8, plan, "", Activations::kF32).mean_kl;
  const double i8_bf16 = compare(WOQ_MODEL_DIR, kFp32, int8, plan, "", Activations::kBf16).mean_kl;
  const double i8_int16 = compare(WOQ_MODEL_DIR, kFp32, int8, plan, "", Activations::kInt16).mean_kl;
  const double i8_default = compare(WOQ_MODEL_DIR, kFp32, int8, plan, "").mean_kl;
  const double i4_i8 = compare(WOQ_MODEL_DIR, kFp32, int4, plan, "", Activations::kInt8).mean_kl;
  const double i4_f32 = compare(WOQ_MODEL_DIR, kFp32, int4, plan, "", Activations::kF32).mean_kl;
  std::printf("mean KL: sym_int8 per channel int8 act %.6f, f32 act %.6f, bf16 act %.6f, int16 act %.7f; sym_int4 g32 "
              "int8 act %.5f, f32 act %.5f\n", i8_i8, i8_f32, i8_bf16, i8_int16, i4_i8, i4_f32);
  EXPECT_LT(i8_f32, 0.75 * i8_i8);
  EXPECT_LT(i8_bf16, 0.75 * i8_i8);
  EXPECT_NEAR(i8_bf16, i8_f32, 0.15 * i8_f32);
  EXPECT_NE(i8_bf16, i8_f32);  // the rounding is applied
  // int16 activations: the weights' error alone, to well under bf16's share (and the rounding is applied).
  EXPECT_LT(std::fabs(i8_int16 - i8_f32), 0.25 * std::fabs(i8_bf16 - i8_f32));
  EXPECT_NE(i8_int16, i8_f32);
  EXPECT_EQ(i8_default, i8_int16);
  EXPECT_NEAR(i4_f32, i4_i8, 0.05 * i4_i8);
}

// A llama-perplexity --kl-divergence-base file written here as its log_softmax writes one (examples/perplexity/
// perplexity.cpp): a peaked row, so that one log-probability sits below e^-16, which llama-perplexity's KL
// leaves out (and its 16-bit row stores as min_logit, not the token's own value).
TEST(Compare, LlamaBaseRowsDecodeAsLlamaPerplexityDoes) {
  const std::vector<float> logits = {10.0f, 0.0f, -1.0f, 9.0f, -20.0f};
  const std::vector<float> cand = {9.0f, 1.0f, 0.0f, 9.5f, -3.0f};
  const float max = 10.0f, min = std::max(-20.0f, max - 16);
  double sum_exp = 0;
  for (float l : logits) sum_exp += std::exp(l - max);
  const auto lse = static_cast<float>(std::log(sum_exp));
  const float scale = (max - min) / 65535.f, min_log_prob = min - max - lse;
  std::vector<std::uint16_t> row(2 * 3 + 4, 0);  // nv = 2·⌈5/2⌉ + 4
  std::memcpy(row.data(), &scale, 4);
  std::memcpy(row.data() + 2, &min_log_prob, 4);
  for (std::size_t i = 0; i < logits.size(); ++i)
    row[4 + i] = logits[i] > min ? static_cast<std::uint16_t>(std::lround((logits[i] - min) / scale)) : 0;
  test::TempDir tmp;
  {
    std::ofstream f(tmp.file("base.kld"), std::ios::binary);
    const std::int32_t head[3] = {4, 5, 1}, tokens[4] = {1, 2, 3, 4};  // n_ctx, n_vocab, n_chunk
    f.write("_logits_", 8);
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    f.write(reinterpret_cast<const char*>(tokens), sizeof tokens);
    f.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size() * 2));  // position 2
  }
  EXPECT_TRUE(is_llama_logits_file(tmp.file("base.kld")));
  const LlamaLogitsPlan with_bos = llama_logits_plan(tmp.file("base.kld"), 1, 5, 2048);  // starts with BOS 1
  EXPECT_TRUE(with_bos.bos);
  EXPECT_FALSE(llama_logits_plan(tmp.file("base.kld"), 0, 5, 2048).bos);
  EXPECT_THROW(llama_logits_plan(tmp.file("base.kld"), 1, 5, 3), Error);  // n_ctx 4 beyond a context of 3
  const ScoringPlan& plan = with_bos.plan;
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0], (std::vector<std::int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(plan.first_scored, 2);
  RefLogprobFile ref = RefLogprobFile::open(tmp.file("base.kld"), plan, 5);
  std::vector<float> decoded(5);
  ref.read(decoded.data());
  ref.expect_end();
  // llama-perplexity's sums: the base's decoded log-probabilities above -16 against the candidate's log-softmax.
  double c_sum = 0;
  for (float c : cand) c_sum += std::exp(static_cast<double>(c));
  double kl = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    const float p_log = scale * static_cast<float>(row[4 + i]) + min_log_prob;
    EXPECT_FLOAT_EQ(decoded[i], p_log) << i;
    if (p_log > -16.f) kl += std::exp(static_cast<double>(p_log)) * (p_log - (cand[i] - std::log(c_sum)));
  }
  EXPECT_LT(decoded[4], -16.0f);  // the row's one left-out entry
  CompareAccumulator acc(5, ref.kl_floor());
  acc.add(decoded.data(), cand.data(), 4);  // the target after position 2
  const CompareStats s = acc.result();
  EXPECT_NEAR(s.mean_kl, kl, 5e-8);  // woq rounds the candidate's log-softmax to float; the left-out entry weighs 2.7e-7
  EXPECT_EQ(s.same_top, 0.0);  // 10 against 9.5
  EXPECT_NEAR(s.ref.mean_nll, -static_cast<double>(decoded[4]), 1e-9);
  // A woq file keeps every log-probability: the same row with nothing left out gives a larger KL here.
  CompareAccumulator all(5);
  all.add(decoded.data(), cand.data(), 4);
  EXPECT_GT(std::fabs(all.result().mean_kl - kl), 1e-7);
}

TEST(Compare, SavedReferenceIsReusedAndChecked) {
  test::TempDir tmp;
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const auto tokens = tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt"));
  const ScoringPlan plan = chunk_plan(tokens, 128, 4, 1);
  const QuantSpec q4{LowBit::kSymInt4, 32, Int4Range::kFull};
  const CompareStats direct = compare(WOQ_MODEL_DIR, kFp32, q4, plan, tmp.file("ref.bin"));
  RefLogprobFile ref = RefLogprobFile::open(tmp.file("ref.bin"), plan, 512);
  ThreadPool pool(2);
  auto cand = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{q4, std::nullopt, std::nullopt, {}}, pool);
  CompareAccumulator acc(512);
  std::vector<float> row(512);
  run_plan(*cand, plan, 0, [&](std::int64_t, std::int64_t, std::int32_t target, const float* l) {
    ref.read(row.data());
    acc.add(row.data(), l, target);
  });
  EXPECT_EQ(acc.result().mean_kl, direct.mean_kl);
  auto error_of = [&](const ScoringPlan& p, std::int64_t vocab) {
    try {
      RefLogprobFile::open(tmp.file("ref.bin"), p, vocab);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(chunk_plan(tokens, 64, 4, 1), 512).find("scored from 32"), std::string::npos);
  EXPECT_NE(error_of(plan, 32000).find("vocabulary of 512"), std::string::npos);
  ScoringPlan other = plan;
  other.sequences[2][7] += 1;
  EXPECT_NE(error_of(other, 512).find("sequence 2 holds different tokens"), std::string::npos);
  {  // trailing bytes: another run's file
    std::ofstream(tmp.file("ref.bin"), std::ios::app | std::ios::binary) << "xxxx";
    RefLogprobFile longer = RefLogprobFile::open(tmp.file("ref.bin"), plan, 512);
    for (std::int64_t i = 0; i < plan.scored_tokens(); ++i) longer.read(row.data());
    EXPECT_THROW(longer.expect_end(), Error);
  }
  {  // a corrupted value
    std::fstream f(tmp.file("ref.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4 * 512 * 3, std::ios::end);
    const float nan = std::nanf("");
    f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  RefLogprobFile corrupt = RefLogprobFile::open(tmp.file("ref.bin"), plan, 512);
  try {
    for (std::int64_t i = 0; i < plan.scored_tokens(); ++i) corrupt.read(row.data());
    FAIL() << "a NaN was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a log-probability (corrupt file?)"), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(tmp.file("ref.bin"), std::filesystem::file_size(tmp.file("ref.bin")) - 8);
  RefLogprobFile cut = RefLogprobFile::open(tmp.file("ref.bin"), plan, 512);
  for (std::int64_t i = 0; i + 3 < plan.scored_tokens(); ++i) cut.read(row.data());
  try {
    cut.read(row.data());  // the NaN row
  } catch (const Error&) {
  }
  cut.read(row.data());
  try {
    cut.read(row.data());
    FAIL() << "read past the end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ref.bin: ends before the last scored position"), std::string::npos) << e.what();
  }
}

TEST(Explain, IdenticalModelsAgreeEverywhere) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  auto a = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  auto b = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  const Explanation e = explain(*a, *b, tok, "Once upon a time", 20);
  EXPECT_EQ(e.diverges_at, -1);
  EXPECT_EQ(e.original_ids, e.quantized_ids);
  ASSERT_EQ(e.kl.size(), 20u);
  for (const double kl : e.kl) EXPECT_EQ(kl, 0.0);
  ASSERT_EQ(e.layers.size(), 35u);  // 5 layers x 7 linears
  for (const auto& l : e.layers) {
    EXPECT_EQ(l.weight_error, 0.0);
    EXPECT_EQ(l.output_error, 0.0);
  }
}

// explain splits each int8-activation layer's error: with f32 activations only the weights' part remains.
TEST(Explain, WeightsOnlyErrorOfInt8ActivationLayers) {
  ThreadPool pool(2);
  auto original = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  auto q8 = LlamaModel::load(WOQ_MODEL_DIR,
                             LoadOptions{{LowBit::kSymInt8, 32, Int4Range::kFull}, std::nullopt, Activations::kInt8, {}}, pool);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const Explanation e = explain(*original, *q8, tok, "Once upon a time", 12);
  ASSERT_EQ(e.layers.size(), 35u);
  for (const LinearError& l : e.layers) {
    ASSERT_GE(l.weights_only_error, 0.0) << l.name;
    EXPECT_LT(l.weights_only_error, l.output_error) << l.layer << " " << l.name;
  }
  auto f32 = LlamaModel::load(WOQ_MODEL_DIR,
                              LoadOptions{{LowBit::kSymInt8, 32, Int4Range::kFull}, std::nullopt, Activations::kF32, {}}, pool);
  for (const LinearError& l : explain(*original, *f32, tok, "Once upon a time", 4).layers) EXPECT_EQ(l.weights_only_error, -1.0);
}

TEST(Explain, QuantizedModelDivergenceIsLocatedAndRanked) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  auto a = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  auto b = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{{LowBit::kSymInt4, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}, pool);
  const Explanation e = explain(*a, *b, tok, "Once upon a time", 60);
  ASSERT_GE(e.diverges_at, 0);  // 60 greedy tokens of a 4-bit 260K-parameter model differ somewhere
  const auto d = static_cast<std::size_t>(e.diverges_at);
  for (std::size_t i = 0; i < d; ++i) EXPECT_EQ(e.original_ids[i], e.quantized_ids[i]);
  EXPECT_NE(e.original_ids[d], e.quantized_ids[d]);
  ASSERT_EQ(e.original_top.size(), 2u);
  EXPECT_EQ(e.original_top[0].id, e.original_ids[d]);  // greedy picked the top-1
  EXPECT_EQ(e.quantized_top[0].id, e.quantized_ids[d]);  // same prefix, so the same position for both
  EXPECT_GE(e.original_top[0].p, e.original_top[1].p);
  ASSERT_EQ(e.layers.size(), 35u);
  for (std::size_t i = 0; i + 1 < e.layers.size(); ++i) EXPECT_GE(e.layers[i].output_error, e.layers[i + 1].output_error);
  for (const auto& l : e.layers) {
    EXPECT_GT(l.weight_error, 0.01);
    EXPECT_LT(l.weight_error, 0.5);
  }
  EXPECT_GT(e.kl[d], 0.0);
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// Recovery errors are paired: a variant that agrees with the baseline item by item has no error, however few items.
TEST(Recovery, AgreementItemByItemHasNoError) {
  const std::vector<double> acc = {1, 0, 0, 1, 0, 1, 1, 0, 0, 0};
  const Recovery r = task_recovery(acc, acc, 1000, 7);
  EXPECT_DOUBLE_EQ(r.percent, 100.0);
  EXPECT_EQ(r.standard_error, 0.0);
}

// The paired bootstrap against the f64 delta method for a ratio of means, SE(R) = sqrt(Var(v - R b) / n) / mean(b),
// on 0/1 scores where the variant flips 10 % of the baseline's answers.
TEST(Recovery, BootstrapMatchesTheDeltaMethod) {
  std::mt19937_64 rng(3);
  std::bernoulli_distribution right(0.45), flip(0.1);
  std::vector<double> b, v;
  for (int i = 0; i < 2000; ++i) {
    b.push_back(right(rng) ? 1.0 : 0.0);
    v.push_back(flip(rng) ? 1.0 - b.back() : b.back());
  }
  const double n = static_cast<double>(b.size());
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / n, mv = std::accumulate(v.begin(), v.end(), 0.0) / n;
  const double ratio = mv / mb;
  double var = 0;
  for (std::size_t i = 0; i < b.size(); ++i) var += (v[i] - ratio * b[i]) * (v[i] - ratio * b[i]);
  const double delta_se = 100.0 * std::sqrt(var / (n - 1) / n) / mb;
  const Recovery r = task_recovery(b, v, 2000, 11);
  EXPECT_NEAR(r.percent, 100.0 * ratio, 1e-9);
  EXPECT_NEAR(r.standard_error, delta_se, 0.1 * delta_se) << "delta method " << delta_se;
  // Unpaired errors would be several times larger: the bootstrap must use the pairs.
  EXPECT_LT(r.standard_error, 0.5 * 100.0 * ratio * std::sqrt((1 - mb) / (mb * n) + (1 - mv) / (mv * n)));
}

TEST(Recovery, PerplexityByHand) {
  const Recovery r = perplexity_recovery({1.0, 2.0, 3.0}, {1.5, 2.0, 3.5});
  // d = {0.5, 0, 0.5}: mean 1/3, sample sd sqrt(1/12), so se = percent * sqrt(1/12) / sqrt(3) = percent / 6.
  EXPECT_NEAR(r.percent, 100.0 * std::exp(-1.0 / 3.0), 1e-12);
  EXPECT_NEAR(r.standard_error, r.percent / 6.0, 1e-12);
}

TEST(Recovery, AverageOfIndependentTasks) {
  const Recovery r = mean_recovery({{100.0, 3.0}, {90.0, 4.0}});
  EXPECT_DOUBLE_EQ(r.percent, 95.0);
  EXPECT_DOUBLE_EQ(r.standard_error, 2.5);
  EXPECT_THROW(mean_recovery({}), Error);
}

TEST(Recovery, BadInput) {
  EXPECT_THROW(task_recovery({1, 0}, {1}, 100, 1), Error);
  EXPECT_THROW(task_recovery({}, {}, 100, 1), Error);
  EXPECT_THROW(perplexity_recovery({1.0}, {}), Error);
  EXPECT_TRUE(std::isnan(task_recovery({0, 0}, {1, 0}, 100, 1).percent));
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// Undefined recoveries (a baseline of 0) stay out of the average; one item has no error estimate.
TEST(Recovery, UndefinedPartsAreLeftOutAndSaySo) {
  const Recovery zero = task_recovery({0, 0, 0}, {1, 0, 0}, 100, 1);
  EXPECT_TRUE(std::isnan(zero.percent));
  EXPECT_TRUE(std::isnan(zero.standard_error));
  EXPECT_TRUE(std::isnan(task_recovery({1}, {1}, 100, 1).standard_error));
  EXPECT_TRUE(std::isnan(perplexity_recovery({1.0}, {2.0}).standard_error));
  const Recovery avg = mean_recovery({zero, {90.0, 4.0}});
  EXPECT_DOUBLE_EQ(avg.percent, 90.0);
  EXPECT_DOUBLE_EQ(avg.standard_error, 4.0);
  EXPECT_TRUE(std::isnan(mean_recovery({zero}).percent));
}

}  // namespace
}  // namespace woq
