// The woq binary as a user runs it: the acceptance command, help, and exit
// codes and messages for bad input.
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "test_files.h"
#include "woq_cli.h"

namespace woq {
namespace {

using test::run;
using test::RunResult;

const std::string kModel = WOQ_MODEL_DIR;

// eval perplexity --kl-divergence-base writes llama-perplexity's base file: its header and tokens as
// llama.cpp's own file of the same chunks (tiny-Q3_K_M.kld; each chunk's first token is BOS in woq's, which
// llama-perplexity puts there when reading either), rows that score woq against itself at KLD 0 and another
// model at llama.cpp's figure. (llama-perplexity --kl-divergence read such a file at KLD 0.000046 when written.)
TEST(Cli, PerplexityWritesALlamaPerplexityBaseFile) {
  const std::string dir = WOQ_TEST_DATA "/gguf_kquant/";
  test::TempDir tmp;
  const std::string text = " --file " WOQ_TEST_DATA "/tinystories_heldout.txt -t 2";
  RunResult r = run("eval perplexity -m " + dir + "tiny-Q3_K_M.gguf --ctx 64 --chunks 4 --kl-divergence-base " +
                    tmp.file("w.kld") + " --json " + tmp.file("p.json") + text);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ours = test::read_file(tmp.file("w.kld")), llama = test::read_file(dir + "tiny-Q3_K_M.kld");
  ASSERT_EQ(ours.size(), llama.size());
  EXPECT_EQ(ours.substr(0, 20), llama.substr(0, 20));
  for (std::size_t t = 0; t < 4 * 64; ++t)
    if (t % 64 != 0) {
      EXPECT_EQ(ours.substr(20 + 4 * t, 4), llama.substr(20 + 4 * t, 4)) << "token " << t;
    }
  const auto compare = [&](const std::string& file) {
    const RunResult c = run("eval compare -m " + dir + file + " --load-ref " + tmp.file("w.kld") + " -t 2 --json " +
                            tmp.file("c.json"));
    EXPECT_EQ(c.code, 0) << c.err;
    return nlohmann::json::parse(test::read_file(tmp.file("c.json")));
  };
  const nlohmann::json self = compare("tiny-Q3_K_M.gguf");
  EXPECT_LT(std::fabs(self["mean_kl"].get<double>()), 2e-6);  // the 16-bit rows' noise, either side of 0
  EXPECT_EQ(self["same_top"].get<double>(), 1.0);
  const double ppl = nlohmann::json::parse(test::read_file(tmp.file("p.json")))["ppl"].get<double>();
  EXPECT_NEAR(self["ref_ppl"].get<double>(), ppl, 1e-5 * ppl);
  EXPECT_NEAR(compare("tiny-Q2_K.gguf")["mean_kl"].get<double>(), 1.790412, 0.01);
  r = run("eval perplexity -m " + dir + "tiny-Q3_K_M.gguf --ctx 64 --per-document x --kl-divergence-base " +
          tmp.file("d.kld") + text);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--per-document scoring does not give"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("d.kld")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("d.kld.tmp")));
}

TEST(Cli, AcceptanceGreedyFp32PrintsReferenceText) {
  std::ifstream in(WOQ_TEST_DATA "/stories260K_greedy_once_upon_a_time.json");
  const auto ref = nlohmann::json::parse(in);
  for (const std::string env : {"", "WOQ_ISA=scalar"}) {
    const RunResult r = run("generate -m " + kModel + " -p \"Once upon a time\" -n 60 --temperature 0 --low-bit fp32", env);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, ref["text"].get<std::string>() + "\n") << env;
    EXPECT_NE(r.err.find("generated 60 tokens"), std::string::npos) << r.err;
  }
  const std::string text = ref["text"].get<std::string>();
  const RunResult r = run("generate -m " + kModel +
                          " -p \"Once upon a time\" -n 60 --temperature 0 --low-bit fp32 --stop park --stop \"red ball\"");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, text.substr(0, text.find("park")) + "\n");
  EXPECT_NE(r.err.find("stopped at stop string 'park'"), std::string::npos) << r.err;
}

TEST(Cli, DefaultIsSymInt4AndSaysSo) {
  const RunResult r = run("generate -m " + kModel + " -p \"Once upon a time\" -n 20 --seed 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time").size() + 20);
  EXPECT_NE(r.err.find("35 linear layers (q/k/v/o/gate/up/down) F32 -> sym_int4 (group_size 32, full range)"),
            std::string::npos)
      << r.err;
  // Same seed, same story.
  EXPECT_EQ(run("generate -m " + kModel + " -p \"Once upon a time\" -n 20 --seed 3").out, r.out);
}

TEST(Cli, HelpDocumentsEveryFlag) {
  const RunResult r = run("generate --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--model", "--prompt", "--n-predict", "--temperature", "--top-k", "--top-p", "--seed",
                           "--low-bit", "--group-size", "--int4-range", "--threads"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  EXPECT_NE(run("--help").out.find("generate"), std::string::npos);
}

TEST(Cli, MakeRandomThenGenerate) {
  test::TempDir tmp;
  const std::string out = tmp.file("m");
  const RunResult made = run("make-random --preset tiny --layers 1 --seed 5 -o " + out);
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_NE(made.err.find("tiny preset, 1 layer,"), std::string::npos) << made.err;
  const RunResult gen = run("generate -m " + out + " -p \"Once upon a time\" -n 8 --temperature 0");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("Once upon a time", 0), 0u) << gen.out;
  EXPECT_NE(gen.err.find("generated 8 tokens"), std::string::npos) << gen.err;
  EXPECT_EQ(run("make-random --preset nope -o " + tmp.file("n")).code, 1);
  // An existing output is kept unless --force, as woq quantize does.
  const RunResult again = run("make-random --preset tiny --layers 1 --seed 6 -o " + out);
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find(out + ": already exists (pass --force"), std::string::npos) << again.err;
  // --force replaces the directory whole: no file of the earlier preset (Llama 3's tokenizer.json) is left.
  ASSERT_EQ(run("make-random --preset tiny-llama3 --layers 1 --force -o " + out).code, 0);
  ASSERT_EQ(run("make-random --preset tiny --layers 1 --seed 6 --force -o " + out).code, 0);
  EXPECT_FALSE(std::filesystem::exists(out + "/tokenizer.json"));
  const RunResult after = run("generate -m " + out + " -p hi -n 2");
  EXPECT_EQ(after.code, 0) << after.err;
  const RunResult not_a_model = run("make-random --preset tiny --force -o " + tmp.path());
  EXPECT_EQ(not_a_model.code, 1);
  EXPECT_NE(not_a_model.err.find("has no config.json: remove it yourself"), std::string::npos) << not_a_model.err;
}

// A failed make-random leaves nothing at -o (it writes beside it and renames), so the retry is not refused as
// "already exists"; nor the parent directories it had to create (issue 29 E).
TEST(Cli, FailedMakeRandomLeavesNoOutput) {
  test::TempDir tmp;
  const std::string out = tmp.file("a/b/m");
  RunResult r = run("make-random --preset tiny-llama3 --layers 1 --tokenizer-root /nonexistent -o " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/llama3/tokenizer.json: not found"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "left behind: " << std::filesystem::directory_iterator(tmp.path())->path();
  r = run("make-random --preset tiny-llama3 --layers 1 -o " + out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
  // A failed --force keeps the existing model as it was.
  const std::string config = test::read_file(out + "/config.json");
  r = run("make-random --preset tiny-llama3 --layers 2 --tokenizer-root /nonexistent --force -o " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(test::read_file(out + "/config.json"), config);
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(tmp.file("a/b"))) ++entries;
  EXPECT_EQ(entries, 1u);
}

// What killed woq quantize runs left beside an output (.OUT.tmp-PID-RANDOM directories, OUT.tmp-PID files of a
// GGUF output) is removed by the next run to that output once their process is gone, even a run that is then
// refused, and said on stderr; a live process's, another output's and other names are kept (issue 29 E).
TEST(Cli, QuantizeRemovesWhatKilledRunsLeftEvenWhenRefused) {
  const pid_t dead = fork();  // a PID that no longer runs: a child that exited and was reaped
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  test::TempDir tmp;
  const auto make = [&](const std::string& name, bool dir) {
    if (dir) std::filesystem::create_directory(tmp.file(name));
    else test::write_file(tmp.file(name), "partial");
    return tmp.file(name);
  };
  const std::string stale_dir = make(fmt::format(".q.tmp-{}-0123abcd", dead), true);
  const std::string live_dir = make(fmt::format(".q.tmp-{}-0123abcd", getpid()), true);
  const std::string stale_file = make(fmt::format("q.gguf.tmp-{}", dead), false);
  const std::string live_file = make(fmt::format("q.gguf.tmp-{}", getpid()), false);
  const std::vector<std::string> kept = {live_dir, live_file, make(fmt::format("r.gguf.tmp-{}", dead), false),
                                         make(fmt::format("q.gguf.tmp-{}x", dead), false),
                                         make(fmt::format("q.gguf.tmp-0{}", dead), false)};
  std::filesystem::create_directory(tmp.file("q"));  // the output exists: the run is refused
  RunResult r = run("quantize -m " + kModel + " -o " + tmp.file("q") + " --method gptq");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(fmt::format("woq: removed {}, left by woq quantize process {}, which is no longer running",
                                   stale_dir, dead)), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(stale_dir));
  test::write_file(tmp.file("q.gguf"), "");
  r = run("quantize -m " + kModel + " -o " + tmp.file("q.gguf"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(fmt::format("woq: removed {}, left by woq quantize process {}", stale_file, dead)),
            std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(stale_file));
  for (const std::string& k : kept) EXPECT_TRUE(std::filesystem::exists(k)) << k;
}

TEST(Cli, BadInputExitsNonZeroWithMessage) {
  test::TempDir empty;
  struct Bad {
    std::string args, env, expect;
  };
  const Bad cases[] = {
      {"generate -m " + empty.path() + " -p hi", "", "config.json: not found"},
      {"generate -m " + empty.path() + "/missing -p hi", "", empty.path() + "/missing: no such file or directory"},
      {"generate -m " WOQ_MODEL_DIR "/config.json -p hi", "", "config.json: not a model directory"},
      {"generate -m " + kModel + " -p hi --low-bit int3", "", "unknown low-bit type 'int3'"},
      {"generate -m " + kModel + " -p hi --group-size 0", "", "group_size 0 is invalid"},
      {"generate -m " + kModel + " -p hi --int4-range half", "", "unknown int4 range"},
      {"generate -m " + kModel + " -p hi --low-bit q4_1 --group-size 64", "", "q4_1's blocks are fixed (32 weights)"},
      {"generate -m " + kModel + " -p hi --low-bit q5_1 --rounding woq", "", "q5_1 is quantized with ggml's rounding only"},
      {"generate -m " + kModel + " -p hi --temperature inf", "", "temperature must be finite"},
      {"generate -m " + kModel + " -p hi --top-p 0", "", "top_p must be in (0, 1]"},
      {"generate -m " + kModel + " -p hi", "WOQ_ISA=sse9", "WOQ_ISA='sse9' is not one of"},
  };
  for (const auto& c : cases) {
    const RunResult r = run(c.args, c.env);
    EXPECT_EQ(r.code, 1) << c.args;
    EXPECT_NE(r.err.find("woq: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  const RunResult usage = run("generate -p hi");  // missing -m: a usage error
  EXPECT_EQ(usage.code, 2);
  EXPECT_NE(usage.err.find("woq: error: --model is required"), std::string::npos) << usage.err;
  EXPECT_NE(usage.err.find("Run 'woq generate --help' for the flags"), std::string::npos) << usage.err;
  // A mistyped word or flag is named, before any missing required flag.
  const std::pair<std::string, std::string> typos[] = {
      {"genrate -m x", "unknown command 'genrate' (commands: generate, bench,"},
      {"eval perplexty -m x", "unknown command 'perplexty' (commands: perplexity, compare, tasks, recovery, pareto)"},
      {"eval perplexity -m " + kModel + " --bogus", "unknown flag '--bogus'\nRun 'woq eval perplexity --help'"},
      {"generate -m " + kModel + " -p hi extra", "unknown argument 'extra'"},
      {"", "a command is required (generate, bench, make-random,"},
      {"eval", "a command is required (perplexity, compare, tasks, recovery, pareto)\nRun 'woq eval --help' for the commands."}};
  for (const auto& [args, expect] : typos) {
    const RunResult r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find("woq: error: " + expect), std::string::npos) << r.err;
  }
  // -n past the context is not an error: generation stops there (or earlier at a stop token) and says why.
  const RunResult big = run("generate -m " + kModel + " -p hi -n 9223372036854775807 --temperature 0");
  EXPECT_EQ(big.code, 0) << big.err;
  EXPECT_NE(big.err.find("stopped at the BOS token 1 '<s>'"), std::string::npos) << big.err;  // llama2.c ends stories so
}

// woq quantize writes a GPTQ checkpoint that woq generate then runs as
// stored, with the same text as quantizing in memory.
TEST(Cli, QuantizeThenGenerateFromTheCheckpoint) {
  test::TempDir tmp;
  const std::string out = tmp.file("q4");
  RunResult r = run("quantize -m " + kModel + " -o " + out + " --low-bit sym_int4 --group-size 32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("layer 5/5 quantized"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("note: K = 172 (intermediate_size) is not a multiple of group_size 32"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("35 linear layers; tensors 0.99 MiB -> 0.26 MiB"), std::string::npos) << r.err;
  const RunResult stored = run("generate -m " + out + " -p \"Once upon a time\" -n 30 --temperature 0");
  ASSERT_EQ(stored.code, 0) << stored.err;
  // The checkpoint says how it was made (quantization_config.meta): woq, round to nearest.
  EXPECT_NE(stored.err.find("35 linear layers used as stored in the GPTQ v1 4-bit sym group_size 32 (woq "), std::string::npos)
      << stored.err;
  EXPECT_NE(stored.err.find(", rtn) checkpoint (read in"), std::string::npos)
      << stored.err;
  const RunResult memory = run("generate -m " + kModel + " -p \"Once upon a time\" -n 30 --temperature 0 --group-size 32");
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_EQ(stored.out, memory.out);

  r = run("quantize -m " + kModel + " -o " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("already exists (pass --force to replace it)"), std::string::npos) << r.err;
  r = run("quantize -m " + kModel + " -o " + tmp.file("x") + " --gptq-format v3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--gptq-format 'v3' is not one of: v1, v2"), std::string::npos) << r.err;
  r = run("quantize -m " + kModel + " -o " + tmp.file("x") + " --low-bit fp16");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("writes integer formats"), std::string::npos) << r.err;
  EXPECT_FALSE(std::ifstream(tmp.file("x") + "/config.json").good());
}

TEST(Cli, QuantizeGptqWritesALoadableCheckpointAndChecksItsFlags) {
  test::TempDir tmp;
  const std::string out = tmp.file("gptq");
  RunResult r = run("quantize -m " + kModel + " -o " + out + " --method gptq --calib random:8x64 --desc-act -t 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("GPTQ calibration: 8 sequences x 64 tokens (random ids, seed 0)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
  const auto config = nlohmann::json::parse(test::read_file(out + "/config.json"));
  EXPECT_EQ(config["quantization_config"]["desc_act"], true);
  EXPECT_EQ(config["quantization_config"]["meta"]["woq_method"], "gptq");
  r = run("generate -m " + out + " -p \"Once upon a time\" -n 10");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("act-order (woq "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", gptq, damp_percent 0.01) checkpoint"), std::string::npos) << r.err;

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--method gptq --calib random:2x4x5", "--calib 'random:2x4x5' is not random or random:NxL"},
      {"--method gptq --calib random:0x5", "--calib 'random:0x5' is not random or random:NxL"},
      {"--method gptq --calib random:2x99999", "exceed the model's context of 512"},
      {"--method gptq --calib random:99999999999x2", "GiB at its peak (one decoder block in fp32"},
      {"--method gptq --damp-percent 2", "--damp-percent must be in (0, 1], got 2"},
      {"--method gptq --calib-file /nonexistent/calib.txt", "--calib-file /nonexistent/calib.txt: "},
      {"--method gptq --calib random:2x4 --calib-file x.txt", "--calib and --calib-file are alternatives"},
      {"--damp-percent 0.05", "--damp-percent applies to --method gptq or awq+gptq only"},
      {"--calib-file x.txt", "--calib-file applies to --method gptq, awq or awq+gptq only"},
  };
  for (const auto& [flags, message] : bad) {
    r = run("quantize -m " + kModel + " -o " + tmp.file("bad") + " " + flags);
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}

TEST(Cli, EvalPerplexityAndCompare) {
  test::TempDir tmp;
  const std::string text = std::string(WOQ_TEST_DATA) + "/tinystories_heldout.txt";
  RunResult r = run("eval perplexity -m " + kModel + " --low-bit fp32 -f " + text + " --ctx 128 --chunks 5 --json " +
                    tmp.file("ppl.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("over 315 scored tokens (5 chunks of 128 tokens scored from 64)"), std::string::npos) << r.out;
  const auto ppl = nlohmann::json::parse(test::read_file(tmp.file("ppl.json")));
  EXPECT_GT(ppl["ppl"].get<double>(), 1.0);
  EXPECT_LT(ppl["ppl"].get<double>(), 512.0);
  EXPECT_EQ(ppl["tokens"], 315);

  r = run("eval compare -m " + kModel + " --low-bit sym_int4 -f " + text + " --ctx 128 --chunks 5 --save-ref " +
          tmp.file("ref.bin") + " --json " + tmp.file("cmp.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Mean KLD"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Same top token"), std::string::npos) << r.out;
  const auto first = nlohmann::json::parse(test::read_file(tmp.file("cmp.json")));
  EXPECT_NEAR(first["ref_ppl"].get<double>(), ppl["ppl"].get<double>(), 1e-6 * ppl["ppl"].get<double>());  // fp32 log-probs
  r = run("eval compare -m " + kModel + " --low-bit sym_int4 -f " + text + " --ctx 128 --chunks 5 --load-ref " +
          tmp.file("ref.bin") + " --json " + tmp.file("cmp2.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(tmp.file("cmp2.json")))["mean_kl"], first["mean_kl"]);
  r = run("eval compare -m " + kModel + " --low-bit sym_int4 -f " + text + " --ctx 64 --chunks 5 --load-ref " +
          tmp.file("ref.bin"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("same --file, --ctx, --chunks and mode?"), std::string::npos) << r.err;
  r = run("eval perplexity -m " + kModel + " -f " + kModel + "/config.json --ctx 512");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("config.json: the text has"), std::string::npos) << r.err;
  r = run("eval perplexity -m " + kModel + " -f /nonexistent.txt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent.txt: not found"), std::string::npos) << r.err;
}

// `model` (a SentencePiece tokenizer.model) with the entries of pieces `a` and `b` swapped: the ModelProto's
// top-level fields are read (protobuf's wire format), the two `pieces` fields (number 1) exchanged.
std::string swap_pieces(const std::string& model, std::size_t a, std::size_t b) {
  std::vector<std::string> fields;
  std::vector<std::size_t> pieces;  // indices in `fields`
  std::size_t at = 0;
  const auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto byte = static_cast<unsigned char>(model.at(at++));
      v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) return v;
    }
  };
  while (at < model.size()) {
    const std::size_t start = at;
    const std::uint64_t tag = varint();
    if ((tag & 7) == 0) varint();
    else if ((tag & 7) == 1) at += 8;
    else if ((tag & 7) == 5) at += 4;
    else if ((tag & 7) == 2) at += varint();
    else throw std::runtime_error("tokenizer.model: unexpected wire type");
    if (tag >> 3 == 1) pieces.push_back(fields.size());
    fields.push_back(model.substr(start, at - start));
  }
  std::swap(fields.at(pieces.at(a)), fields.at(pieces.at(b)));
  std::string out;
  for (const std::string& f : fields) out += f;
  return out;
}

// eval compare --ref (and recovery, explain --ref) with a reference whose tokenizer differs only in two swapped pieces: the
// vocabulary sizes match, but KL would compare different tokens id by id; refused naming both models and the
// first differing id with both pieces (issue 29 B).
TEST(Cli, EvalCompareRefusesAReferenceWithAnotherTokenizer) {
  test::TempDir tmp;
  const std::string ref = tmp.file("swapped");
  test::copy_model(kModel, ref);
  test::write_file(ref + "/tokenizer.model", swap_pieces(test::read_file(kModel + "/tokenizer.model"), 403, 407));
  const std::string text = std::string(WOQ_TEST_DATA) + "/tinystories_heldout.txt";
  RunResult r = run("eval compare -m " + kModel + " --ref " + ref + " -f " + text + " --ctx 128 --chunks 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("the reference " + ref + " has another tokenizer than the model " + kModel + ": token 403 is '"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("Mean KLD"), std::string::npos) << r.out;
  r = run("eval recovery -m " + kModel + " --ref " + ref + " --tasks arc_easy --limit 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("has another tokenizer than the model"), std::string::npos) << r.err;
  r = run("explain -m " + kModel + " --ref " + ref + " -p Once -n 4");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("has another tokenizer than the model"), std::string::npos) << r.err;
  test::copy_model(kModel, ref);  // the same tokenizer again: accepted
  r = run("eval compare -m " + kModel + " --ref " + ref + " -f " + text + " --ctx 128 --chunks 2");
  EXPECT_EQ(r.code, 0) << r.err;
}

// --tasks openllm: the six Open LLM Leaderboard v1 tasks at their shot counts,
// found under --data-dir in the bundled files' layout.
TEST(Cli, EvalTasksOpenLlmPreset) {
  test::TempDir tmp;
  const std::filesystem::path data = WOQ_TEST_DATA, dir = tmp.file("tasks");
  namespace fs = std::filesystem;
  for (const char* sub : {"arc_challenge", "hellaswag", "winogrande", "truthfulqa"}) fs::create_directories(dir / sub);
  fs::copy(data / "mmlu_slice", dir / "mmlu", fs::copy_options::recursive);
  fs::copy(data / "gsm8k_slice", dir / "gsm8k", fs::copy_options::recursive);
  fs::copy_file(data / "hellaswag_slice.txt", dir / "hellaswag/hellaswag_val_full.txt");
  fs::copy_file(data / "winogrande_slice.jsonl", dir / "winogrande/winogrande_dev.jsonl");
  fs::copy_file(data / "truthfulqa_slice.json", dir / "truthfulqa/mc_task.json");
  std::string arc;
  for (int i = 0; i < 30; ++i)
    arc += R"({"question": "Which is number )" + std::to_string(i) + R"(?", "options": [{"label": "A", "text": ")" +
           std::to_string(i) + R"("}, {"label": "B", "text": ")" + std::to_string(i + 1) + R"("}], "answer": "A"})" + "\n";
  test::write_file((dir / "arc_challenge/arc_challenge_test.jsonl").string(), arc);
  RunResult r = run("eval tasks -m " + kModel + " --tasks openllm --data-dir " + dir.string() + " --limit 1 --json " +
                    tmp.file("o.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* row : {"| mmlu | 2 | 5 | acc * |", "| arc_challenge | 1 | 25 | acc_norm * |", "| gsm8k | 1 | 5 | exact_match * |",
                          "| hellaswag | 1 | 10 | acc_norm * |", "| winogrande | 1 | 5 | acc * |", "| truthfulqa_mc2 | 1 | 0 | mc2 * |"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  const auto j = nlohmann::json::parse(test::read_file(tmp.file("o.json")));
  ASSERT_EQ(j.size(), 6u);
  EXPECT_EQ(j[5]["primary_metric"], "mc2");
  EXPECT_TRUE(j[5]["mc2"].is_number());
  // With no --data-dir, the full files bundled in assets/tasks (--data-dir above overrode them).
  r = run("eval tasks -m " + kModel + " --tasks arc_easy,winogrande --limit 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| arc_easy | 3 | 0 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| winogrande | 3 | 5 |"), std::string::npos) << r.out;
  // A bad output path fails before any scoring.
  r = run("eval tasks -m " + kModel + " --tasks openllm --data-dir " + dir.string() + " --json " + tmp.file("no/such/dir.json"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("its folder " + tmp.file("no/such") + " does not exist"), std::string::npos) << r.err;
  r = run("eval tasks -m " + kModel + " --tasks mmlu5 --data-dir " + dir.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown task 'mmlu5'"), std::string::npos) << r.err;
}

TEST(Cli, EvalTasksRecoveryAndExplain) {
  test::TempDir tmp;
  const std::string data = WOQ_TEST_DATA;
  RunResult r = run("eval tasks -m " + kModel + " --tasks jsonl=" + data + "/three_questions.jsonl,arc_easy=" + data +
                    "/arc_easy_slice.jsonl --num-fewshot 2 --limit 10 --json " + tmp.file("t.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| jsonl | 3 | 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| arc_easy | 10 | 2 |"), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(tmp.file("t.json"))).size(), 2u);
  r = run("eval tasks -m " + kModel + " --tasks jsonl");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--tasks jsonl: give its file as jsonl=PATH"), std::string::npos) << r.err;

  r = run("eval recovery -m " + kModel + " --tasks jsonl=" + data + "/three_questions.jsonl,truthfulqa_mc2=" + data +
          "/truthfulqa_slice.json --limit 3 --low-bit sym_int8,sym_int4 " + "--ppl-file " + data +
          "/tinystories_heldout.txt --ctx 128 --markdown " + tmp.file("r.md"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| jsonl acc (0-shot, 3 items) |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| truthfulqa_mc2 mc2 (0-shot, 3 items) |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| metric | fp32 | sym_int8 | sym_int4 | sym_int8 recovery | sym_int4 recovery |"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| average recovery"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(tmp.file("r.md")), r.out);

  r = run("explain -m " + kModel + " --low-bit sym_int4 -p \"Once upon a time\" -n 40 --json " + tmp.file("e.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("They first differ at generated token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("original's top-2 there"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Quantization error per linear layer"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(test::read_file(tmp.file("e.json")));
  EXPECT_EQ(j["layers"].size(), 35u);
  EXPECT_EQ(j["kl"].size(), 40u);
}

// woq bench: one JSON line per test, each with only its own figures (null where one does not apply); the format
// column says what the linears are (a GGUF's own type, not --low-bit's default); one repetition has no ± column.
TEST(Cli, BenchRowsCarryTheirOwnFigures) {
  test::TempDir tmp;
  RunResult r = run("bench -m " + kModel + " -p 16 -n 8 -r 2 -t 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << r.out;
  const auto &pp = rows[0], &tg = rows[1];
  EXPECT_EQ(pp["test"], "pp16");
  EXPECT_GT(pp["first_token_ms"].get<double>(), 0.0);
  EXPECT_TRUE(pp["next_token_ms"].is_null());
  EXPECT_TRUE(pp["gbps"].is_null());
  EXPECT_TRUE(pp["bw_fraction"].is_null());
  EXPECT_EQ(tg["test"], "tg8");
  EXPECT_TRUE(tg["first_token_ms"].is_null());
  EXPECT_GT(tg["next_token_ms"].get<double>(), 0.0);
  EXPECT_GT(tg["gbps"].get<double>(), 0.0);
  EXPECT_NEAR(tg["gbps"].get<double>() * 1e9, tg["avg_ts"].get<double>() * tg["bytes_per_token"].get<double>(), 1e3);
  // stories260K reads 0.27 MB per token: in any last-level cache, so no share of memory bandwidth is claimed.
  if (tg["in_cache"].get<bool>()) {
    EXPECT_TRUE(tg["bw_fraction"].is_null()) << tg;
  }
  EXPECT_EQ(pp["low_bit"], "sym_int4");
  EXPECT_EQ(pp["activations"], "sym_int4 int8");

  r = run("bench -m " + kModel + " -p 8 -n 4 -r 1 -t 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| sym_int4 | 1 | pp8 | "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("±"), std::string::npos) << r.out;
  // A bad format or activations is refused before anything is measured or printed.
  r = run("bench -m " + kModel + " -p 8 -n 4 -r 1 -t 1 --low-bit sym_int4,int3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("unknown low-bit type 'int3'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("memory read bandwidth"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");

  const std::string gguf = tmp.file("q8.gguf");
  r = run("quantize -m " + kModel + " -o " + gguf + " --format gguf --low-bit sym_int8");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("bench -m " + gguf + " -p 0 -n 4 -r 1 -t 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["low_bit"].get<std::string>().rfind("sym_int8", 0), 0u) << r.out;
}

// woq bench --by-format: after the tg row, one row per weight format of a mixed model (lm_head apart) whose
// matrices and bytes are the model's: every block linear and lm_head counted once.
TEST(Cli, BenchByFormatRowsCoverTheMixedModelsMatrices) {
  test::TempDir tmp;
  const std::string plan = tmp.file("plan.json");
  test::write_file(plan, R"({"woq_plan": 1, "base": {"low_bit": "sym_int4", "group_size": 32}, "tensors": {
      "model.layers.0.mlp.down_proj": {"low_bit": "sym_int8", "group_size": -1},
      "model.layers.1.self_attn.v_proj": {"low_bit": "fp16"}}})");
  const RunResult r = run("bench -m " + kModel + " -p 0 -n 4 -r 1 -t 1 --by-format --json --plan " + plan);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 5u) << r.out;
  EXPECT_EQ(rows[0]["test"], "tg4");
  std::map<std::string, std::int64_t> matrices;
  std::uint64_t bytes = 0;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["test"], "tg_by_format");
    matrices[rows[i]["format"].get<std::string>()] = rows[i]["matrices"].get<std::int64_t>();
    bytes += rows[i]["bytes_per_token"].get<std::uint64_t>();
    EXPECT_GT(rows[i]["ms_per_token"].get<double>(), 0.0);
  }
  const std::map<std::string, std::int64_t> want{{"sym_int4 g32, int8 activations", 33},
                                                 {"sym_int8 per channel, int16 activations", 1},
                                                 {"fp16", 1},
                                                 {"lm_head fp32", 1}};
  EXPECT_EQ(matrices, want) << r.out;
  // The tg row's bytes per token less what is not a matrix: one embedding row (hidden 64) and the RMSNorm
  // weights (2 per block of 5, and the final one).
  EXPECT_EQ(bytes, rows[0]["bytes_per_token"].get<std::uint64_t>() - 64 * 4 - (2 * 5 + 1) * 64 * 4) << r.out;
  // Without a tg test there is nothing to set the rows beside: refused, not ignored.
  const RunResult none = run("bench -m " + kModel + " -p 8 -n 0 -r 1 -t 1 --by-format");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.err.find("--by-format"), std::string::npos) << none.err;
}

// GGUF -> GPTQ -> GGUF from the CLI: the GPTQ checkpoint made from the bundled model's F32 GGUF (GPTQ
// calibration included) tells the same greedy story as the one made from the directory, and goes back to GGUF.
TEST(Cli, QuantizeGgufToGptqAndBack) {
  test::TempDir tmp;
  const std::string gguf = tmp.file("f32.gguf"), greedy = " -p 'Once upon a time' -n 40 --temperature 0";
  RunResult r = run("quantize -m " + kModel + " -o " + gguf + " --low-bit fp32");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string gptq = " --method gptq --low-bit sym_int8 --group-size -1 --calib random:8x32";
  r = run("quantize -m " + gguf + " -o " + tmp.file("from_gguf") + gptq);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("woq: wrote " + tmp.file("from_gguf") + " (GPTQ v1, sym_int8 per channel, gptq)"), std::string::npos) << r.err;
  ASSERT_EQ(run("quantize -m " + kModel + " -o " + tmp.file("from_dir") + gptq).code, 0);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json", "model.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(tmp.file("from_gguf/") + f)) << f;
  const RunResult a = run("generate -m " + tmp.file("from_gguf") + greedy), b = run("generate -m " + tmp.file("from_dir") + greedy);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(test::read_file(tmp.file("from_gguf/model.safetensors")), test::read_file(tmp.file("from_dir/model.safetensors")));
  // From a Q4_0 file the group size defaults to Q4_0's 32: the checkpoint keeps the blocks, so the same story.
  ASSERT_EQ(run("quantize -m " + kModel + " -o " + tmp.file("q4_0.gguf") + " --low-bit sym_int4").code, 0);
  r = run("quantize -m " + tmp.file("q4_0.gguf") + " -o " + tmp.file("from_q4_0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("linear layers are ggml blocks of 32: --group-size 32"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(GPTQ v1, sym_int4 group_size 32, rtn)"), std::string::npos) << r.err;
  EXPECT_EQ(run("generate -m " + tmp.file("from_q4_0") + greedy).out, run("generate -m " + tmp.file("q4_0.gguf") + greedy).out);
  // An existing output is refused before any work.
  r = run("quantize -m " + gguf + " -o " + tmp.file("from_gguf") + gptq);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.find("GPTQ calibration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("already exists (pass --force to replace it)"), std::string::npos) << r.err;
  // Back to GGUF, dequantized exactly (F32): the same story when run unquantized.
  r = run("quantize -m " + tmp.file("from_gguf") + " -o " + tmp.file("back.gguf") + " --low-bit fp32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(run("generate -m " + tmp.file("back.gguf") + greedy + " --low-bit fp32").out, a.out);
}

// generate -f reads the prompt from a file; --repeat-penalty changes a greedy story (stories260K repeats itself).
TEST(Cli, GeneratePromptFileAndRepeatPenalty) {
  test::TempDir tmp;
  test::write_file(tmp.file("p.txt"), "Once upon a time");
  const std::string greedy = " -n 60 --temperature 0";
  const RunResult from_p = run("generate -m " + kModel + " -p 'Once upon a time'" + greedy);
  const RunResult from_f = run("generate -m " + kModel + " -f " + tmp.file("p.txt") + greedy);
  ASSERT_EQ(from_f.code, 0) << from_f.err;
  EXPECT_EQ(from_f.out, from_p.out);
  const RunResult penalized = run("generate -m " + kModel + " -p 'Once upon a time'" + greedy + " --repeat-penalty 1.3");
  ASSERT_EQ(penalized.code, 0) << penalized.err;
  EXPECT_NE(penalized.out, from_p.out);
  EXPECT_EQ(run("generate -m " + kModel + " -p 'Once upon a time'" + greedy + " --repeat-penalty 1.3 --repeat-last-n 0").out,
            from_p.out);
  RunResult r = run("generate -m " + kModel + " -n 4");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("-p,--prompt or -f,--file is required"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " -f " + tmp.file("none.txt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("none.txt: not found"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " -p hi --repeat-penalty 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("repeat_penalty must be in [0.001, 1000]"), std::string::npos) << r.err;
}

// Flags that would do nothing are refused (usage errors exit 2, others 1) or warned about; -c/--ctx-size is the
// context flag of every command, --ctx its old spelling.
TEST(Cli, FlagsThatWouldDoNothingAreRefusedOrWarned) {
  test::TempDir tmp;
  RunResult r = run("generate -m " + kModel + " -p hi --stop ''");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--stop: must not be empty"), std::string::npos) << r.err;
  r = run("quantize -m " + kModel + " -o " + tmp.file("q") + " --method gptq --calib random:4x8 --nsamples 10");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--nsamples does not apply to --calib random:4x8"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " -p hi -n 2 --low-bit fp16 --activations int8");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --activations int8 has no effect"), std::string::npos) << r.err;
  r = run("generate -m " + kModel + " -p hi -n 2 --group-size 16");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: group_size 16 is not a multiple of 32"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int4 f32"), std::string::npos) << r.err;  // what it really runs
  // A GPTQ directory named *.gguf would be read as a GGUF file by every loading command; --resume has nothing
  // to resume in a round-to-nearest GGUF export. Both refused, nothing written.
  r = run("quantize -m " + kModel + " -o " + tmp.file("x.gguf") + " --format gptq");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("a name ending in .gguf is read as a GGUF file"), std::string::npos) << r.err;
  r = run("quantize -m " + kModel + " -o " + tmp.file("y.gguf") + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--resume applies to --method gptq only"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("x.gguf")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("y.gguf")));
  const std::string text = std::string(WOQ_TEST_DATA) + "/tinystories_heldout.txt";
  for (const char* flag : {"-c", "--ctx-size", "--ctx"}) {
    r = run("eval perplexity -m " + kModel + " -f " + text + " --chunks 1 " + flag + " 64 --json " + tmp.file("p.json"));
    ASSERT_EQ(r.code, 0) << flag << r.err;
    EXPECT_EQ(nlohmann::json::parse(test::read_file(tmp.file("p.json")))["ctx"], 64) << flag;
  }
}

// A saved asym_int4 GPTQ checkpoint against its original (--ref): every side labelled by what it is, read from the
// checkpoint's own metadata, in the text and the JSON; without --ref a note says the comparison is with itself.
TEST(Cli, SavedCheckpointAgainstItsOriginal) {
  test::TempDir tmp;
  const std::string q = tmp.file("q"), data = WOQ_TEST_DATA, text = data + "/tinystories_heldout.txt";
  RunResult r = run("quantize -m " + kModel + " -o " + q + " --method gptq --low-bit asym_int4 --calib random:8x64");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string gptq = "GPTQ v1 4-bit asym group_size 128 (woq ";
  const std::string original = "fp32 as stored [stories260K]";

  r = run("eval compare -m " + q + " --ref " + kModel + " -f " + text + " --ctx 128 --chunks 4 --json " + tmp.file("c.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("candidate: " + gptq), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reference: " + original), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(test::read_file(tmp.file("c.json")));
  EXPECT_EQ(j["low_bit"], "asym_int4");
  EXPECT_NE(j["model"].get<std::string>().find(gptq), std::string::npos) << j["model"];
  EXPECT_EQ(j["ref_model"], original);
  EXPECT_GT(j["mean_kl"].get<double>(), 1e-3);
  EXPECT_EQ(r.err.find("without --ref"), std::string::npos) << r.err;

  // Without --ref the checkpoint is its own reference, dequantized (f32 activations): the int8 activations'
  // error shows (it was 0: the reference took int8 activations too), the weights' share is exactly 0.
  r = run("eval compare -m " + q + " -f " + text + " --ctx 128 --chunks 2 --json " + tmp.file("self.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("is a quantized checkpoint (" + gptq), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Give the original with --ref"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("has no effect"), std::string::npos) << r.err;  // f32 is woq's choice, not a flag
  j = nlohmann::json::parse(test::read_file(tmp.file("self.json")));
  EXPECT_GT(j["mean_kl"].get<double>(), 1e-7) << j.dump();
  EXPECT_EQ(j["weights_only_mean_kl"].get<double>(), 0.0) << j.dump();
  EXPECT_EQ(j["ref_model"], j["model"].get<std::string>() + " (f32 activations)") << j.dump();
  r = run("explain -m " + q + " -p Once -n 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("has no effect"), std::string::npos) << r.err;
  // A rounded reference (--ref-low-bit sym_int4 leaves the stored layers, on int8 activations): said so, and
  // explain shows no "weights' part" (f32 inputs would not isolate the weights against a rounding original).
  r = run("eval compare -m " + q + " --ref-low-bit sym_int4 -f " + text + " --ctx 128 --chunks 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("the checkpoint itself with rounded activations (asym_int4 int8)"), std::string::npos) << r.err;
  r = run("explain -m " + q + " --ref-low-bit sym_int4 -p Once -n 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("weights' part"), std::string::npos) << r.out;

  r = run("eval perplexity -m " + q + " -f " + text + " --ctx 128 --chunks 2 --json " + tmp.file("p.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(test::read_file(tmp.file("p.json")));
  EXPECT_EQ(j["low_bit"], "asym_int4");
  EXPECT_NE(j["model"].get<std::string>().find(gptq), std::string::npos) << j["model"];

  // Recovery: the original is the baseline, the checkpoint one variant as stored; errors on every figure,
  // perplexity apart from the task average.
  r = run("eval recovery -m " + q + " --ref " + kModel + " --tasks jsonl=" + data + "/three_questions.jsonl,arc_easy=" +
          data + "/arc_easy_slice.jsonl --limit 20 --ppl-file " + text + " --ctx 128 --json " + tmp.file("r.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("- baseline: " + original), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("- asym_int4: " + gptq), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| metric | baseline | asym_int4 | asym_int4 recovery |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| average recovery over the 2 tasks | | | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not in the average"), std::string::npos) << r.out;
  j = nlohmann::json::parse(test::read_file(tmp.file("r.json")));
  ASSERT_EQ(j["variants"].size(), 1u);
  ASSERT_EQ(j["tasks"].size(), 2u);
  const auto& arc = j["tasks"][1]["variants"][0];
  EXPECT_GT(arc["recovery_stderr"].get<double>(), 0.0) << arc;
  EXPECT_GT(j["tasks"][1]["baseline"]["stderr"].get<double>(), 0.0);
  const auto& ppl = j["perplexity"]["variants"][0];
  EXPECT_NEAR(ppl["recovery_percent"].get<double>(),
              100.0 * j["perplexity"]["baseline"]["ppl"].get<double>() / ppl["ppl"].get<double>(), 1e-6);
  EXPECT_LT(ppl["recovery_percent"].get<double>(), 100.0);  // 4-bit costs perplexity
  EXPECT_GT(ppl["recovery_stderr"].get<double>(), 0.0);

  // Explain: the checkpoint's greedy text diverges from the original's, and each side says what it is.
  r = run("explain -m " + q + " --ref " + kModel + " -p \"Once upon a time\" -n 40 --json " + tmp.file("e.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("original:  " + original), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantized: " + gptq), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("They first differ at generated token"), std::string::npos) << r.out;
  j = nlohmann::json::parse(test::read_file(tmp.file("e.json")));
  EXPECT_GE(j["diverges_at"].get<int>(), 0);
  EXPECT_EQ(j["ref_model"], original);
  EXPECT_EQ(j["low_bit"], "asym_int4");
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// `woq tokenize` as llama-tokenize: id<TAB>piece lines, --json, --no-special, a tokenizer-only folder.
TEST(Cli, TokenizePrintsIdsAndPieces) {
  const std::string llama3 = WOQ_ASSETS_DIR "/tokenizers/llama3";  // tokenizer files only, no model
  RunResult r = run("tokenize -m " + llama3 + " -p 'Hello world<|eot_id|>\n'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "9906\tHello\n1917\t world\n128009\t<|eot_id|>\n198\t\\n\n");
  r = run("tokenize -m " + llama3 + " -p 'Hello world' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[9906,1917]\n");
  // SentencePiece: BOS first unless --no-special.
  EXPECT_EQ(run("tokenize -m " + kModel + " -p 'Once upon' --json").out, "[1,403,407]\n");
  EXPECT_EQ(run("tokenize -m " + kModel + " -p 'Once upon' --json --no-special").out, "[403,407]\n");
  // A byte-level token that is part of a character is escaped.
  r = run("tokenize -m " + llama3 + " -p '\xF0\x9F\xA6\x99'");
  EXPECT_NE(r.out.find("\\x9f"), std::string::npos) << r.out;
  test::TempDir tmp;
  test::write_file(tmp.file("t.txt"), "a b");
  EXPECT_EQ(run("tokenize -m " + llama3 + " -f " + tmp.file("t.txt") + " --json").out, "[64,293]\n");
  r = run("tokenize -m " + llama3 + " -p a -f " + tmp.file("t.txt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("-p TEXT or -f FILE"), std::string::npos) << r.err;
  r = run("tokenize -m " + tmp.path() + " -p a");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no tokenizer found"), std::string::npos) << r.err;
}

// make-random writes each architecture with its tokenizer; generate runs on it.
TEST(Cli, MakeRandomQwen3GeneratesWithItsTokenizer) {
  test::TempDir tmp;
  const std::string dir = tmp.file("qwen3");
  RunResult r = run("make-random --preset tiny-qwen3 --dtype bf16 -o " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto config = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(config["head_dim"], 32);
  r = run("generate -m " + dir + " -p 'Hello' -n 5 --temperature 0 --low-bit sym_int4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Hello", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("prompt 1 tokens"), std::string::npos) << r.err;  // Qwen adds no BOS
  r = run("make-random --preset llama-3-8b --layers 1 --tokenizer-root " + tmp.file("none") + " -o " + tmp.file("l3"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--tokenizer-root"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// --activations on the command line: eval compare splits the error of int8 activations off the weights'.
TEST(Cli, ActivationsFlagAndAttribution) {
  const std::string common = "eval compare -m " + kModel + " -f " WOQ_TEST_DATA "/tinystories_heldout.txt --ctx 128 --chunks 4";
  RunResult r = run(common + " --low-bit sym_int4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int4 int8"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("With f32 activations (the weights alone): mean KLD = "), std::string::npos) << r.out;
  r = run(common + " --low-bit sym_int8");  // int16 by default: split too
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int8 int16"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("With f32 activations (the weights alone): mean KLD = "), std::string::npos) << r.out;
  r = run(common + " --low-bit sym_int8 --activations bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int8 bf16"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("With f32 activations (the weights alone): mean KLD = "), std::string::npos) << r.out;
  r = run(common + " --low-bit sym_int8 --activations f32");  // nothing to split
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int8 f32"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("has no effect"), std::string::npos) << r.err;  // the flag is the candidate's, not the fp32 reference's
  EXPECT_EQ(r.out.find("With f32 activations"), std::string::npos) << r.out;
  r = run(common + " --low-bit sym_int8 --activations int4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown activations 'int4' (expected int8, f32, bf16 or int16)"), std::string::npos) << r.err;
  r = run(common + " --low-bit sym_int8 --activations ''");  // refused, not taken for the default
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("an empty value"), std::string::npos) << r.err;
  // The report names the activations whose rounding it measures.
  r = run(common + " --low-bit sym_int8 --activations int16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rounding the activations (sym_int8 int16) adds"), std::string::npos) << r.out;
  // eval recovery: --activations is the variants', not the fp32 baseline's (no false "has no effect").
  r = run("eval recovery -m " + kModel + " --low-bit sym_int8 --activations int16 --tasks arc_easy=" WOQ_TEST_DATA
          "/arc_easy_slice.jsonl --limit 20");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("has no effect"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("activations: sym_int8 int16"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// Reads from `fd` until `marker` appears after `from` in `got`, or 60 s pass; false on timeout or EOF.
bool read_until(int fd, std::string& got, const std::string& marker, std::size_t from) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got.find(marker, from) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}

// `woq chat` under a pseudo-terminal, as a user types: a "> " prompt per turn, the history kept from turn to
// turn (the second turn's prompt holds the first exchange), /exit ends it with status 0.
TEST(Cli, ChatUnderAPseudoTerminal) {
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(WOQ_BIN, WOQ_BIN, "chat", "-m", WOQ_MODEL_DIR, "-n", "12", "--temperature", "0", "-t", "1",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string got;
  ASSERT_TRUE(read_until(master, got, "> ", 0)) << got;
  ASSERT_EQ(write(master, "Hello\n", 6), 6);
  ASSERT_TRUE(read_until(master, got, "turn 1: prompt ", 0)) << got;
  ASSERT_TRUE(read_until(master, got, "> ", got.find("turn 1: prompt "))) << got;
  ASSERT_EQ(write(master, "Tell me more\n", 13), 13);
  ASSERT_TRUE(read_until(master, got, "turn 2: prompt ", 0)) << got;
  ASSERT_TRUE(read_until(master, got, "> ", got.find("turn 2: prompt "))) << got;
  // /clear is not a turn: the next reply is turn 3, its prompt one message again.
  ASSERT_EQ(write(master, "/clear\n", 7), 7);
  ASSERT_TRUE(read_until(master, got, "conversation cleared", 0)) << got;
  ASSERT_EQ(write(master, "Hi\n", 3), 3);
  ASSERT_TRUE(read_until(master, got, "turn 3: prompt ", 0)) << got;
  ASSERT_TRUE(read_until(master, got, "> ", got.find("turn 3: prompt "))) << got;
  ASSERT_EQ(write(master, "\x04", 1), 1);  // Ctrl-D: the end, on a line of its own
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  read_until(master, got, "\n", got.rfind("> "));  // whatever it wrote before it ended (EIO once it exits)
  close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << got;
  EXPECT_EQ(got.find("turn 4"), std::string::npos) << got;
  EXPECT_NE(got.find("(1 message; 0 tokens cached), reply"), std::string::npos) << got;  // turn 1: one message, singular
  EXPECT_EQ(got.find("(1 messages)"), std::string::npos) << got;
  EXPECT_EQ(got.back(), '\n') << got;
  auto tokens_of = [&](const std::string& turn) {
    const std::size_t at = got.find(turn) + turn.size();
    return std::stoi(got.substr(at));
  };
  const int first = tokens_of("turn 1: prompt "), second = tokens_of("turn 2: prompt ");
  EXPECT_GT(second, first + 12) << got;  // the first exchange (and its 12-token reply) is in the second prompt
  // The second turn's KV cache holds the first prompt at least (and the reply as the template renders it again).
  const std::size_t cached_at = got.find(" tokens cached", got.find("turn 2: prompt "));
  ASSERT_NE(cached_at, std::string::npos) << got;
  const std::size_t number_at = got.rfind("; ", cached_at) + 2;
  EXPECT_GE(std::stoi(got.substr(number_at, cached_at - number_at)), first) << got;
  EXPECT_NE(got.find("reply 12 tokens"), std::string::npos) << got;
}

}  // namespace
}  // namespace woq
