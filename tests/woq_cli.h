// Running the woq binary (WOQ_BIN, defined for every test) from a test: its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "test_files.h"

namespace woq::test {

struct RunResult {
  int code;
  std::string out;
  std::string err;
};

/// Runs `env WOQ_BIN args` through the shell (env: e.g. "WOQ_ISA=avx2").
inline RunResult run(const std::string& args, const std::string& env = "") {
  TempDir tmp;
  const std::string cmd = env + " " WOQ_BIN " " + args + " > " + tmp.file("out") + " 2> " + tmp.file("err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(tmp.file("out")), read_file(tmp.file("err"))};
}

}  // namespace woq::test
