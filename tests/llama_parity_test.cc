// woq against llama.cpp's own outputs on the GGUF files llama.cpp's tools wrote (tests/data/gguf_kquant): the
// perplexity llama-perplexity prints, the greedy text llama-cli prints, and llama-perplexity's log-probability
// files as eval compare's reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "test_files.h"
#include "woq_cli.h"

namespace woq {
namespace {

using test::run;
using test::RunResult;

// Files llama.cpp's llama-quantize wrote (tests/data/gguf_kquant, every K-quant q2_K ... q6_K in its own
// mixes and q/k row order) give llama-perplexity's value (recorded there) on the same chunks.
TEST(LlamaParity, KQuantFilesGiveLlamaPerplexitysValue) {
  // llama-perplexity c392e5094's values on 16 chunks of 64 tokens, from its AVX-512 and its AVX2 build (README of
  // tests/data/gguf_kquant; the two differ by 1.5e-4, as ggml's sums and exp do): the default (ggml) numerics on
  // each ISA give its build's value to the last digit printed, and woq's numerics the same value on every ISA.
  struct Case {
    std::string file;
    double avx512, avx2;
  };
  const auto ppl = [](const std::string& file, const std::string& flags, const std::string& env) {
    test::TempDir tmp;
    const RunResult r = run("eval perplexity -m " WOQ_TEST_DATA "/gguf_kquant/" + file +
                                " --file " WOQ_TEST_DATA "/tinystories_heldout.txt --ctx 64 --chunks 16 -t 2 --json " +
                                tmp.file("p.json") + flags,
                            env);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("used as stored in the GGUF q"), std::string::npos) << r.err;
    const auto got = nlohmann::json::parse(test::read_file(tmp.file("p.json")));
    EXPECT_EQ(got["tokens"].get<int>(), 496);
    return got["ppl"].get<double>();
  };
  for (const Case& c : {Case{"tiny-Q3_K_M.gguf", 7922.4635, 7923.6425}, Case{"tiny-Q2_K.gguf", 6593.7966, 6592.6175}}) {
    for (const auto& [isa, llama] : {std::pair{Isa::kAvx512, c.avx512}, std::pair{Isa::kAvx2, c.avx2}}) {
      if (!cpu_supports(isa)) {
        std::printf("not tested here: %s (needs %s)\n", isa_name(isa).data(), isa_requirements(isa).data());
        continue;
      }
      EXPECT_NEAR(ppl(c.file, "", "WOQ_ISA=" + std::string(isa_name(isa))), llama, 3e-4) << c.file << " " << isa_name(isa);
    }
    const double woq = ppl(c.file, " --numerics woq", "");
    EXPECT_NEAR(woq, c.avx512, 1e-3 * c.avx512) << c.file;
    EXPECT_EQ(woq, ppl(c.file, " --numerics woq", "WOQ_ISA=scalar")) << c.file;
  }
  // --low-bit converts only float layers: on a file whose every linear is used as stored it says so.
  const RunResult r = run("generate -m " WOQ_TEST_DATA "/gguf_kquant/tiny-Q2_K.gguf -p Once -n 2 --low-bit sym_int8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --low-bit sym_int8 has no effect"), std::string::npos) << r.err;
}

// Greedy text: llama-cli c392e5094's 200 tokens after "Once upon a time" on tiny-Q3_K_M.gguf (its AVX-512 and its
// AVX2 build print the same; README of tests/data/gguf_kquant). Its prompt runs as a batch and each new token
// alone, whose attention sums V in another order (ggml_causal_attention's single_row_pass); woq's own numerics
// part from it after 276 characters.
TEST(LlamaParity, GreedyTextIsLlamaClis) {
  const std::string want = test::read_file(WOQ_TEST_DATA "/gguf_kquant/tiny-Q3_K_M.llama-cli.txt");
  const auto text = [](const std::string& flags, const std::string& env) {
    const RunResult r = run("generate -m " WOQ_TEST_DATA "/gguf_kquant/tiny-Q3_K_M.gguf -p \"Once upon a time\" -n 200 "
                            "--temperature 0 -t 2" + flags, env);
    EXPECT_EQ(r.code, 0) << r.err;
    std::string out = r.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  };
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!cpu_supports(isa)) {
      std::printf("not tested here: %s (needs %s)\n", isa_name(isa).data(), isa_requirements(isa).data());
      continue;
    }
    EXPECT_EQ(text("", "WOQ_ISA=" + std::string(isa_name(isa))), want) << isa_name(isa);
  }
  EXPECT_NE(text(" --numerics woq", ""), want);
}

// llama-perplexity's --kl-divergence-base file (tests/data/gguf_kquant/tiny-Q3_K_M.kld, written by llama.cpp
// c392e5094 from tiny-Q3_K_M.gguf) as eval compare's reference: its chunks' tokens, and the statistics
// llama-perplexity --kl-divergence printed for tiny-Q2_K.gguf against it (README there).
TEST(LlamaParity, LlamaPerplexityBaseFileIsAReference) {
  const std::string dir = WOQ_TEST_DATA "/gguf_kquant/";
  const std::string base = dir + "tiny-Q3_K_M.kld";
  const auto compare = [&](const std::string& file) {
    test::TempDir tmp;
    const RunResult r = run("eval compare -m " + dir + file + " --load-ref " + base + " -t 2 --json " + tmp.file("c.json"));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("With f32 activations"), std::string::npos) << r.out;  // llama.cpp's reference rounds them too
    return nlohmann::json::parse(test::read_file(tmp.file("c.json")));
  };
  const nlohmann::json other = compare("tiny-Q2_K.gguf");
  EXPECT_EQ(other["tokens"].get<int>(), 4 * 31);
  EXPECT_NEAR(other["mean_kl"].get<double>(), 1.790412, 1e-6);
  EXPECT_NEAR(other["same_top"].get<double>() * 124, 19, 1e-9);  // 15.323 %
  EXPECT_NEAR(other["ref_ppl"].get<double>(), 6907.749079, 1e-5 * 6907.749079);
  EXPECT_NEAR(other["ppl"].get<double>(), 5287.493337, 1e-3 * 5287.493337);
  // The very file the base came from: woq computes llama.cpp's logits (ggml numerics), so that only the base
  // file's 16-bit rounding of them is left (llama-perplexity against its own base: the same top token everywhere,
  // KLD within +-4e-5); woq's own numerics differ by up to 9e-4.
  const nlohmann::json same = compare("tiny-Q3_K_M.gguf");
  EXPECT_LT(std::abs(same["mean_kl"].get<double>()), 5e-6);
  EXPECT_LT(same["max_kl"].get<double>(), 1e-4);
  EXPECT_EQ(same["same_top"].get<double>(), 1.0);

  test::TempDir tmp;
  const std::string bytes = test::read_file(base);
  const auto bad = [&](const std::string& content, const std::string& extra, const std::string& message) {
    test::write_file(tmp.file("bad.kld"), content);
    const RunResult r = run("eval compare -m " + dir + "tiny-Q3_K_M.gguf --load-ref " + tmp.file("bad.kld") + extra);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bad.kld"), std::string::npos) << r.err;
  };
  bad(bytes.substr(0, bytes.size() - 100), "", "bytes, but its n_ctx = 64, n_vocab = 512 and n_chunk = 4 make");
  bad(bytes.substr(0, 10), "", "truncated");
  std::string lying = bytes;
  lying[16] = 127;  // n_chunk
  bad(lying, "", "(truncated, or not llama-perplexity's");
  std::string vocab = bytes;
  vocab[12] = 1;  // n_vocab 513
  bad(vocab, "", "n_vocab = 513, this model has a vocabulary of 512");
  std::string token = bytes;
  token[20 + 4 * 5 + 3] = '\x40';  // token 5
  bad(token, "", "token 5 of its chunks is");
  std::string row = bytes;
  row[20 + 64 * 4 * 4 + 3] = '\x7f';  // the first row's scale: 2^255-ish
  bad(row, "", "scored position 0");
  bad(bytes, " --file " WOQ_TEST_DATA "/tinystories_heldout.txt", "--file cannot apply");
  bad(bytes, " --ctx 32", "--ctx cannot apply");
  bad(bytes, " --ref-low-bit q8_0", "--ref-low-bit cannot apply");
  bad(bytes, " --json " + tmp.file("bad.kld"), "is the --load-ref file: writing it would destroy the reference");
  EXPECT_EQ(test::read_file(tmp.file("bad.kld")), bytes);
  std::string many = bytes;
  many[18] = 0x40;  // n_chunk = 0x400004: 2^28 tokens, refused before the size is looked at or anything read
  bad(many, "", "more than the 134217728 tokens woq reads");
  std::string wide = bytes;
  wide[9] = 0x10;  // n_ctx = 4160
  bad(wide, "", "n_ctx = 4160, beyond the model's context of 2048");
  {  // a base whose chunks start without BOS (llama-perplexity's tokenizer added none): scored as the file has them
    std::string no_bos = bytes;
    no_bos[20] = 5;
    test::write_file(tmp.file("nobos.kld"), no_bos);
    const RunResult r = run("eval compare -m " + dir + "tiny-Q3_K_M.gguf --load-ref " + tmp.file("nobos.kld"));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("chunks do not have BOS first, as llama-perplexity left them; this model's tokenizer adds BOS"),
              std::string::npos) << r.err;
    EXPECT_NE(r.out.find("124 scored tokens (4 chunks of 64 tokens scored from 32)"), std::string::npos) << r.out;
  }
  {
    const RunResult r = run("eval compare -m " + dir + "tiny-Q3_K_M.gguf --load-ref " + tmp.file("missing.kld"));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("missing.kld: not found or not a regular file"), std::string::npos) << r.err;
  }
  const RunResult r = run("eval compare -m " + dir + "tiny-Q3_K_M.gguf");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--file is required"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace woq
