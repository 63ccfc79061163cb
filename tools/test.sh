#!/usr/bin/env bash
# Installs dependencies, then builds and runs every test twice: a Release
# build with -Werror, and an AddressSanitizer + UndefinedBehaviorSanitizer build;
# then replays the fuzzers' past findings and fuzzes each target briefly
# (tools/fuzz.sh, WOQ_FUZZ_SECONDS per target, 8 by default here).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
jobs=$(nproc)
# Every reference a test compares against (Python with NumPy/Jinja2, pytest, node with @huggingface/tokenizers)
# must be there: a test that would skip for want of one fails instead (tests/test_files.h).
export WOQ_REQUIRE_REFERENCES=${WOQ_REQUIRE_REFERENCES:-1}
# The pinned OpenAI Node.js client for the server tests, and Hugging Face's JavaScript tokenizers
# for the tokenizer tests (npm registry).
if command -v npm > /dev/null; then
  npm ci --prefix tests/server --no-audit --no-fund --loglevel=error ||
    echo "tools/test.sh: npm ci failed; the OpenAI client tests of woq serve will fail" >&2
  npm ci --prefix tests/tokenizer --no-audit --no-fund --loglevel=error ||
    echo "tools/test.sh: npm ci failed; the comparison with @huggingface/tokenizers will fail" >&2
fi

# The same options as the README's first command, so that a build it made is reused, not recompiled.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWOQ_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

# -O1 -g1 (line tables only) compiles much faster than RelWithDebInfo and keeps useful stack traces.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DWOQ_WERROR=ON -DWOQ_SANITIZE=ON -DWOQ_BUILD_BENCH=OFF
cmake --build build-asan -j "$jobs"
# Under the sanitizers, all tests but five whole-model accuracy comparisons that take 6-45 s in Release and
# 6-8 minutes each under ASan (measured 2026-12-01); the code they run is run under ASan by the smaller
# Gptq.*, Cli.QuantizeGptq*, Compare.*, Explain.*, Tasks.* and Cli.Eval* tests.
asan_skip='^(GptqModel\.BeatsRtnOnHeldOutStories|Tasks\.SharedContextScoringEqualsWholeSequences'
asan_skip+='|Cli\.EvalTasksRecoveryAndExplain|Compare\.ActivationsShareOfTheError'
# RTN, GPTQ, AWQ and AWQ+GPTQ of the bundled model, twice (43 s in Release); AwqAccuracy.FoldingIsExact runs AWQ under ASan.
asan_skip+='|AwqAccuracy\.BeatsRoundToNearestAndHelpsGptq'
# GPTQ of the 8-layer small preset, several times: its RSS bound means nothing under ASan's allocator.
asan_skip+='|GptqStream\..*)$'
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j "$jobs" --output-on-failure -E "$asan_skip"

WOQ_FUZZ_SECONDS=${WOQ_FUZZ_SECONDS:-8} bash tools/fuzz.sh
