// Subcommands of the woq CLI. Each registers its flags on the app and returns
// the function that runs it (after parsing) and gives the exit code.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace woq::cli {

using Run = std::function<int()>;

Run add_generate(CLI::App& app);

}  // namespace woq::cli
