// GPTQ streams the decoder blocks: quantizing a model twice as deep takes no
// more memory, and the first blocks come out the same whatever follows them
// (streaming changes nothing but memory). `woq quantize` runs as a child
// process so that its own peak RSS (wait4's ru_maxrss) is measured.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "test_files.h"

extern char** environ;

namespace woq {
namespace {

struct Child {
  int code = -1;
  long max_rss_kib = 0;
};

// Starts WOQ_BIN with `args` (stdout and stderr to `log`) without waiting.
pid_t start_woq(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {WOQ_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, WOQ_BIN, &files, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&files);
  return pid;
}

// Waits for `pid`, with its rusage.
Child wait_woq(pid_t pid) {
  Child c;
  int status = 0;
  rusage ru{};
  if (pid <= 0 || wait4(pid, &status, 0, &ru) != pid) return c;
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  c.max_rss_kib = ru.ru_maxrss;
  return c;
}

// Runs WOQ_BIN with `args` (stdout and stderr to `log`) to its end.
Child run_woq(const std::vector<std::string>& args, const std::string& log) { return wait_woq(start_woq(args, log)); }

// Polls `log` until it holds `text`; false when the process ends first or after two minutes.
bool wait_for_text(pid_t pid, const std::string& log, const std::string& text) {
  for (int i = 0; i < 2400; ++i) {
    if (test::read_file(log).find(text) != std::string::npos) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;  // reaped: the caller's wait_woq then fails
    usleep(50'000);
  }
  return false;
}

std::vector<std::string> gptq_flags(const std::string& in, const std::string& out) {
  return {"quantize", "-m", in, "-o", out, "--method", "gptq", "--low-bit", "sym_int4", "--group-size", "128",
          "--calib", "random:8x128", "-t", "2"};
}

std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out[e.path().filename().string()] = test::read_file(e.path().string());
  return out;
}

// The 4- and 8-layer models of the small preset (same seed: the 8-layer one continues the 4-layer one) and the
// 8-layer model's GPTQ output, made once for the tests below.
class GptqStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir;
    for (const int layers : {4, 8}) {
      const std::string model = tmp_->file(fmt::format("small-{}", layers));
      ASSERT_EQ(run_woq({"make-random", "--preset", "small", "--layers", std::to_string(layers), "-o", model},
                        tmp_->file("make.log")).code, 0) << test::read_file(tmp_->file("make.log"));
      const std::string log = tmp_->file(fmt::format("quantize-{}.log", layers));
      const Child c = run_woq(gptq_flags(model, model + "-gptq"), log);
      ASSERT_EQ(c.code, 0) << test::read_file(log);
      std::printf("GPTQ of %d layers of the small preset: peak RSS %.1f MiB\n", layers,
                  static_cast<double>(c.max_rss_kib) / 1024.0);
      rss_.push_back(c.max_rss_kib);
    }
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string path(const std::string& name) { return tmp_->file(name); }
  static inline test::TempDir* tmp_ = nullptr;
  static inline std::vector<long> rss_;
};

TEST_F(GptqStream, TwiceAsDeepTakesNoMoreMemoryAndTheFirstBlocksAreTheSame) {
  ASSERT_EQ(rss_.size(), 2u);
  EXPECT_NE(test::read_file(path("quantize-8.log")).find("GPTQ memory at its peak: about"), std::string::npos);
  EXPECT_NE(test::read_file(path("quantize-8.log")).find("layer 8/8 GPTQ: read "), std::string::npos);
  // One fp16 block is 25 MB: holding the blocks would add about 100 MB (+40 %) for the four more.
  EXPECT_LE(static_cast<double>(rss_[1]), 1.05 * static_cast<double>(rss_[0]));
  const TensorStore shallow = TensorStore::open(path("small-4-gptq"));
  const TensorStore deep = TensorStore::open(path("small-8-gptq"));
  int compared = 0;
  for (int layer = 0; layer < 4; ++layer)
    for (const char* linear : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      for (const char* part : {"qweight", "qzeros", "scales", "g_idx"}) {
        const std::string name = fmt::format("model.layers.{}.{}.{}", layer, linear, part);
        const TensorView& a = shallow.get(name);
        const TensorView& b = deep.get(name);
        ASSERT_EQ(a.shape, b.shape) << name;
        EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin(), b.bytes.end())) << name;
        ++compared;
      }
  EXPECT_EQ(compared, 4 * 7 * 4);
}

// Ctrl-C stops after the block in progress, SIGKILL anywhere; neither leaves OUT, and --resume finishes with the
// files an uninterrupted run writes.
TEST_F(GptqStream, InterruptedRunsResumeToTheUninterruptedOutput) {
  const std::string in = path("small-8"), out = path("cut"), log = path("cut.log");
  pid_t pid = start_woq(gptq_flags(in, out), log);
  ASSERT_TRUE(wait_for_text(pid, log, "layer 2/8 quantized")) << test::read_file(log);
  kill(pid, SIGINT);
  Child c = wait_woq(pid);
  EXPECT_EQ(c.code, 1) << test::read_file(log);
  EXPECT_NE(test::read_file(log).find("the same command with --resume continues from there"), std::string::npos)
      << test::read_file(log);
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_TRUE(std::filesystem::exists(path(".cut.partial/manifest.json")));

  // Another calibration is another run: refused, and nothing is lost.
  std::vector<std::string> other = gptq_flags(in, out);
  other[other.size() - 3] = "random:8x64";
  other.push_back("--resume");
  ASSERT_EQ(run_woq(other, log).code, 1);
  EXPECT_NE(test::read_file(log).find("belongs to a different run (calibration differs)"), std::string::npos)
      << test::read_file(log);

  std::vector<std::string> resume = gptq_flags(in, out);
  resume.push_back("--resume");
  pid = start_woq(resume, log);
  ASSERT_TRUE(wait_for_text(pid, log, "layer 6/8 quantized")) << test::read_file(log);
  kill(pid, SIGKILL);
  c = wait_woq(pid);
  EXPECT_EQ(c.code, 128 + SIGKILL);
  EXPECT_NE(test::read_file(log).find("resuming: "), std::string::npos) << test::read_file(log);
  EXPECT_FALSE(std::filesystem::exists(out));

  c = run_woq(resume, log);
  ASSERT_EQ(c.code, 0) << test::read_file(log);
  const std::string said = test::read_file(log);
  EXPECT_TRUE(said.find("resuming: 6 of 8 blocks") != std::string::npos ||
              said.find("resuming: 7 of 8 blocks") != std::string::npos) << said;
  EXPECT_EQ(files_of(out), files_of(path("small-8-gptq")));
  EXPECT_FALSE(std::filesystem::exists(path(".cut.partial")));
  for (const auto& e : std::filesystem::directory_iterator(path("")))
    EXPECT_EQ(e.path().filename().string().find(".cut."), std::string::npos) << e.path();  // no temporary left

  // Without --resume an interrupted run's finished blocks are not thrown away: refused, unless --force starts over.
  pid = start_woq(gptq_flags(in, path("again")), log);
  ASSERT_TRUE(wait_for_text(pid, log, "layer 1/8 quantized")) << test::read_file(log);
  kill(pid, SIGKILL);
  wait_woq(pid);
  ASSERT_EQ(run_woq(gptq_flags(in, path("again")), log).code, 1) << test::read_file(log);
  EXPECT_NE(test::read_file(log).find("pass --resume to continue that run, or --force"), std::string::npos)
      << test::read_file(log);
  EXPECT_TRUE(std::filesystem::exists(path(".again.partial/manifest.json")));
  std::vector<std::string> forced = gptq_flags(in, path("again") + "/");  // a trailing '/' names the same output
  forced.push_back("--force");
  ASSERT_EQ(run_woq(forced, log).code, 0) << test::read_file(log);
  EXPECT_NE(test::read_file(log).find("--force: discarded"), std::string::npos) << test::read_file(log);
  EXPECT_EQ(files_of(path("again")), files_of(path("small-8-gptq")));
}

TEST(QuantizeRecipe, FillsTheOptionsNotGiven) {
  test::TempDir tmp;
  struct Case {
    std::vector<std::string> flags;
    int bits;
    int group_size;
    bool desc_act;
    std::string method;
  };
  for (const Case& c : {Case{{"--recipe", "w8a16", "--calib", "random:2x32"}, 8, -1, false, "gptq"},
                        Case{{"--recipe", "w4a16", "--calib", "random:2x32"}, 4, 128, true, "gptq"},
                        Case{{"--recipe", "w4a16", "--group-size", "64", "--calib", "random:2x32"}, 4, 64, true, "gptq"},
                        Case{{"--recipe", "w8a16", "--method", "rtn"}, 8, -1, false, "rtn"}}) {
    const std::string out = tmp.file("out");
    std::vector<std::string> args = {"quantize", "-m", WOQ_MODEL_DIR, "-o", out, "--force"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const Child r = run_woq(args, tmp.file("log"));
    ASSERT_EQ(r.code, 0) << test::read_file(tmp.file("log"));
    const auto q = nlohmann::json::parse(read_text_file(out + "/config.json"))["quantization_config"];
    EXPECT_EQ(q["bits"], c.bits) << c.flags[1];
    EXPECT_EQ(q["group_size"], c.group_size) << c.flags[1];
    EXPECT_EQ(q["desc_act"], c.desc_act) << c.flags[1];
    if (c.method == "gptq") {
      EXPECT_DOUBLE_EQ(q["damp_percent"].get<double>(), 0.01);
    }
    EXPECT_NE(q.dump().find("\"" + c.method + "\""), std::string::npos) << q.dump();
  }
  const Child bad = run_woq({"quantize", "-m", WOQ_MODEL_DIR, "-o", tmp.file("x"), "--recipe", "w2a16"}, tmp.file("log"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(test::read_file(tmp.file("log")).find("--recipe 'w2a16' is not one of: w8a16, w4a16"), std::string::npos)
      << test::read_file(tmp.file("log"));
}

}  // namespace
}  // namespace woq
