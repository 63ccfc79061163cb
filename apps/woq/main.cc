// woq: weight-only-quantized LLM inference. Thin front end: parse flags,
// call the library, print.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "core/cpu.h"
#include "core/utf8.h"
#include "kernels/blas.h"

int main(int argc, char** argv) {
  // OpenBLAS chose its kernels by CPU model when it was loaded; where woq's choice by features differs, run
  // again with it (execv returns only when it fails: go on as is).
  if (woq::choose_blas_kernels()) {
    char self[4096];
    if (const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); n > 0) {
      self[n] = '\0';
      execv(self, argv);  // the program's own path: ps and top go on showing its name
    }
  }
  CLI::App app{"woq: weight-only-quantized LLM inference for Llama-family models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "woq 0.1.0");
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    // Name the subcommand whose flags were wrong ("woq eval compare"): its --help lists them.
    std::string name = "woq";
    for (const CLI::App* cmd = failed; !cmd->get_subcommands().empty();) {
      cmd = cmd->get_subcommands().back();
      name += " " + cmd->get_name();
    }
    // An unknown flag or word is the likelier mistake than the missing flag CLI11 checks first.
    std::string what = e.what(), help = "flags";
    const CLI::App* leaf = failed;
    while (!leaf->get_subcommands().empty()) leaf = leaf->get_subcommands().back();
    const auto commands = [](const CLI::App* cmd) {
      std::vector<std::string> names;
      for (const CLI::App* sub : cmd->get_subcommands({})) names.push_back(sub->get_name());
      return names;
    };
    if (what == "A subcommand is required") {
      what = fmt::format("a command is required ({})", fmt::join(commands(leaf), ", "));
      help = "commands";
    }
    for (const CLI::App* cmd = failed;; cmd = cmd->get_subcommands().back()) {
      if (const std::vector<std::string> extra = cmd->remaining(); !extra.empty()) {
        const std::string word = woq::printable_text(extra[0], 80);  // argv may hold terminal escapes
        what = fmt::format("unknown {} '{}'", extra[0].starts_with('-') ? "flag" : "argument", word);
        if (const auto names = commands(cmd); !names.empty() && !extra[0].starts_with('-')) {
          what = fmt::format("unknown command '{}' (commands: {})", word, fmt::join(names, ", "));
          help = "commands";
        }
        break;
      }
      if (cmd->get_subcommands().empty()) break;
    }
    return fmt::format("woq: error: {}\nRun '{} --help' for the {}.\n", what, name, help);
  });
  const woq::cli::Run generate = woq::cli::add_generate(app);
  const woq::cli::Run bench = woq::cli::add_bench(app);
  const woq::cli::Run make_random = woq::cli::add_make_random(app);
  const woq::cli::Run quantize = woq::cli::add_quantize(app);
  const woq::cli::Run eval = woq::cli::add_eval(app);
  const woq::cli::Run explain = woq::cli::add_explain(app);
  const woq::cli::Run serve = woq::cli::add_serve(app);
  const woq::cli::Run tokenize = woq::cli::add_tokenize(app);
  const woq::cli::Run chat = woq::cli::add_chat(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, the version or the usage error
    return code == 0 ? 0 : 2;
  }
  try {
    std::string command;  // "eval perplexity"
    for (const CLI::App* cmd = &app; !cmd->get_subcommands().empty();) {
      cmd = cmd->get_subcommands().back();
      command += (command.empty() ? "" : " ") + cmd->get_name();
    }
    woq::cli::join_job(argc, argv, command);  // under mpirun: this rank's place, checked against the others
    woq::active_isa();  // a bad WOQ_ISA fails before any work
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("bench")) return bench();
    if (app.got_subcommand("make-random")) return make_random();
    if (app.got_subcommand("quantize")) return quantize();
    if (app.got_subcommand("eval")) return eval();
    if (app.got_subcommand("explain")) return explain();
    if (app.got_subcommand("serve")) return serve();
    if (app.got_subcommand("tokenize")) return tokenize();
    if (app.got_subcommand("chat")) return chat();
  } catch (const std::exception& e) {
    return woq::cli::end_job(e.what());  // in an MPI job, ends every rank
  }
  return 1;
}
