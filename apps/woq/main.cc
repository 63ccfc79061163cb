// woq: weight-only-quantized LLM inference. Thin front end: parse flags,
// call the library, print.
#include <cstdio>
#include <exception>

#include <fmt/core.h>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"woq: weight-only-quantized LLM inference for Llama-family models"};
  app.require_subcommand(1);
  const woq::cli::Run generate = woq::cli::add_generate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("generate")) return generate();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "woq: error: {}\n", e.what());
    return 1;
  }
  return 1;
}
