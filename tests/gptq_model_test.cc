// GPTQ over the bundled stories260K model, calibrated on TinyStories text
// and evaluated on held-out stories against fp32: lower KL than RTN, for
// every format.
#include <gtest/gtest.h>

#include <cstdio>

#include "eval/logit_compare.h"
#include "io/json_file.h"
#include "quantize/gptq_calibration.h"
#include "test_files.h"

namespace woq {
namespace {

// Teacher-forced logits over held-out windows.
std::vector<float> heldout_logits(const std::string& dir, const QuantSpec& spec, const Calibration& windows,
                                  ThreadPool& pool) {
  auto model = LlamaModel::load(dir, LoadOptions{spec, std::nullopt, std::nullopt, {}}, pool);
  std::vector<float> all, logits;
  for (const auto& w : windows) {
    KVCache cache = model->make_cache(static_cast<std::int64_t>(w.size()));
    model->forward(w, cache, true, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(GptqModel, BeatsRtnOnHeldOutStories) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const Calibration heldout = text_calibration(tok, read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt"), 16, 256);
  const std::string calib_text = read_text_file(WOQ_TEST_DATA "/tinystories_calibration.txt");
  const auto ref = heldout_logits(WOQ_MODEL_DIR, {LowBit::kFp32, 32, Int4Range::kFull}, heldout, pool);
  const std::int64_t vocab = 512;
  struct Case {
    QuantSpec spec;
    GptqZeros zeros;
    bool true_sequential = false;
    bool desc_act = false;
  };
  for (const Case& c : {Case{{LowBit::kSymInt4, 32, Int4Range::kFull}, GptqZeros::kV1},
                        Case{{LowBit::kAsymInt4, 32, Int4Range::kFull}, GptqZeros::kV2},
                        Case{{LowBit::kSymInt8, -1, Int4Range::kFull}, GptqZeros::kV1},
                        Case{{LowBit::kSymInt4, 32, Int4Range::kFull}, GptqZeros::kV1, true, true}}) {
    test::TempDir tmp;
    QuantizeOptions options;
    options.spec = c.spec;
    options.zeros = c.zeros;
    options.method = "gptq";
    auto model = load_for_calibration(WOQ_MODEL_DIR, pool);
    const TensorStore store = TensorStore::open(WOQ_MODEL_DIR);
    GptqOptions g;
    g.spec = c.spec;
    g.desc_act = c.desc_act;
    options.desc_act = c.desc_act;
    quantize_checkpoint(WOQ_MODEL_DIR, tmp.file("gptq"), options, pool,
                        gptq_block_quantizer(*model, store, text_calibration(tok, calib_text, 64, 256), g,
                                             c.true_sequential, pool));
    const LogitAgreement rtn = compare_logits(ref, heldout_logits(WOQ_MODEL_DIR, c.spec, heldout, pool), vocab);
    const LogitAgreement gptq = compare_logits(ref, heldout_logits(tmp.file("gptq"), c.spec, heldout, pool), vocab);
    std::printf("%-9s g%-3lld%s held-out vs fp32: RTN mean KL %.5f top-1 %.1f %% | GPTQ mean KL %.5f top-1 %.1f %%\n",
                std::string(low_bit_name(c.spec.type)).c_str(), static_cast<long long>(c.spec.group_size),
                c.true_sequential ? " true_sequential desc_act" : "", rtn.mean_kl,
                100 * rtn.top1_agreement, gptq.mean_kl, 100 * gptq.top1_agreement);
    EXPECT_GT(gptq.mean_kl, 0.0);
    EXPECT_LT(gptq.mean_kl, rtn.mean_kl) << low_bit_name(c.spec.type);
  }
}

}  // namespace
}  // namespace woq
