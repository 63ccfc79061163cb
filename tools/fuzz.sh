#!/usr/bin/env bash
# Coverage-guided fuzzing of woq's parsers of untrusted input (fuzz/*_fuzz.cc,
# libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer).
#
#   tools/fuzz.sh [TARGET...]        all targets when none are named
#
# Configures and builds build-fuzz (clang, -DWOQ_FUZZ=ON), then for each
# target: replays fuzz/regressions/TARGET/* (inputs of past findings: each
# must now pass; those under a strict/ folder with WOQ_FUZZ_STRICT=1), and
# fuzzes for WOQ_FUZZ_SECONDS (default 60) on a copy of fuzz/corpus/TARGET
# kept in build-fuzz/fuzz-corpus/TARGET (the repository is never written; the
# copy grows from run to run). Prints the executions of each target and their
# total; exits 1 on any finding (a crash, sanitizer
# report, uncaught exception, broken invariant, a unit over 10 s, over
# 2048 MB) and prints the reproducer's path and how to rerun it.
#
# Environment:
#   WOQ_FUZZ_SECONDS   seconds per target (default 60)
#   WOQ_FUZZ_TARGETS   targets to run when none are given as arguments
#   WOQ_FUZZ_CXX       the clang++ to build with (default clang++-14)
#   WOQ_FUZZ_BUILD     build directory (default build-fuzz)
#   WOQ_FUZZ_JOBS      build parallelism (default nproc)
#   WOQ_FUZZ_PARALLEL  targets fuzzed at the same time (default 1; up to the
#                      number of cores: each libFuzzer process uses one)
#   WOQ_FUZZ_STRICT=1  nlohmann::json exceptions escaping a woq API count as findings
#   WOQ_FUZZ_REAL_FILES=1  also read the multi-MB real files (Llama 3 / Qwen3
#                      tokenizer.json, ...) as extra read-only corpus dirs
#   WOQ_FUZZ_NO_BUILD=1    skip configure + build (use the binaries already there)
set -uo pipefail
cd "$(dirname "$0")/.."
# The whole script is one { } group: bash parses it before running it, so that
# editing this file during a long run cannot derail the run.
{
secs=${WOQ_FUZZ_SECONDS:-60}
build=${WOQ_FUZZ_BUILD:-build-fuzz}
cxx=${WOQ_FUZZ_CXX:-clang++-14}
jobs=${WOQ_FUZZ_JOBS:-$(nproc)}
parallel=${WOQ_FUZZ_PARALLEL:-1}

all_targets=(safetensors safetensors_index hf_config generation_config tokenizer_json tokenizer_config
             tokenizer_encode tokenizer_time jinja jinja_chat openai_request)
all_targets+=(gguf)
if (($# > 0)); then
  targets=("$@")
elif [[ -n ${WOQ_FUZZ_TARGETS:-} ]]; then
  read -r -a targets <<< "$WOQ_FUZZ_TARGETS"
else
  targets=("${all_targets[@]}")
fi
for t in "${targets[@]}"; do
  if [[ ! -f fuzz/${t}_fuzz.cc ]]; then
    echo "tools/fuzz.sh: no target '$t' (have: ${all_targets[*]})" >&2
    exit 2
  fi
done

# The dictionary of each target.
dict_of() {
  case $1 in
    safetensors | safetensors_index) echo fuzz/safetensors.dict ;;
    gguf) echo fuzz/gguf.dict ;;
    hf_config | generation_config) echo fuzz/hf_config.dict ;;
    tokenizer_json | tokenizer_config | tokenizer_encode | tokenizer_time) echo fuzz/tokenizer.dict ;;
    jinja) echo fuzz/jinja.dict ;;
    jinja_chat | openai_request) echo fuzz/openai.dict ;;
    *) echo fuzz/json.dict ;;
  esac
}
# Repository folders read as extra corpus dirs (read-only: libFuzzer writes
# new inputs to the first dir only, the copy in the build directory).
extra_dirs_of() {
  case $1 in
    jinja) echo tests/data/chat_templates ;;
    tokenizer_json) [[ ${WOQ_FUZZ_REAL_FILES:-0} == 1 ]] && echo assets/tokenizers/llama3 assets/tokenizers/qwen3 ;;
    tokenizer_config) [[ ${WOQ_FUZZ_REAL_FILES:-0} == 1 ]] && echo assets/tokenizers/llama3 assets/tokenizers/qwen3 ;;
  esac
  return 0
}

if [[ ${WOQ_FUZZ_NO_BUILD:-0} != 1 ]]; then
  # -O1 -g: fast enough to fuzz, full line information in reports; no NDEBUG.
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DWOQ_FUZZ=ON -DWOQ_BUILD_TESTS=OFF \
    -DWOQ_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" > /dev/null ||
    { echo "tools/fuzz.sh: cmake configure failed" >&2; exit 2; }
  build_targets=()
  for t in "${targets[@]}"; do build_targets+=(--target "${t}_fuzz"); done
  cmake --build "$build" -j "$jobs" "${build_targets[@]}" || { echo "tools/fuzz.sh: build failed" >&2; exit 2; }
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# -report_slow_units: inputs over 2 s are printed as slow (the tokenizer_time target measures growth with length).
common=(-rss_limit_mb=2048 -timeout=10 -report_slow_units=2)
mkdir -p "$build/fuzz-logs"
results=$build/fuzz-results
rm -rf "$results"
mkdir -p "$results"

# Fuzzes one target; its table row goes to $results/T.row and each finding
# as one line to $results/T.findings (so that targets can run side by side).
fuzz_target() {
  local t=$1 bin=$build/bin/${1}_fuzz f log strict work artifacts extras rc execs eps cov status crash what
  : > "$results/$t.findings"

  # 1. Past findings, one process each so that every failing one is named.
  if [[ -d fuzz/regressions/$t ]]; then
    while IFS= read -r -d '' f; do
      log=$build/fuzz-logs/$t.regression.$(basename "$f").log
      strict=${WOQ_FUZZ_STRICT:-0}
      [[ $f == */strict/* ]] && strict=1  # findings of WOQ_FUZZ_STRICT=1 replay under it
      if ! WOQ_FUZZ_STRICT=$strict timeout -s KILL 300 "$bin" "${common[@]}" "$f" > "$log" 2>&1; then
        echo "$t: regression $f fails again: $(grep -m1 -E 'ERROR|WOQ_FUZZ_CHECK|terminate|SUMMARY' "$log" || echo "see $log")" >> "$results/$t.findings"
        echo "== $t: regression input $f FAILS (log: $log); rerun: $bin $f"
      fi
    done < <(find "fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
  fi

  # 2. Fuzzing on the copy of the seeds.
  work=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t/
  mkdir -p "$work" "$artifacts"
  cp -f "fuzz/corpus/$t"/* "$work"/ 2> /dev/null
  read -r -a extras <<< "$(extra_dirs_of "$t")"
  log=$build/fuzz-logs/$t.log
  echo "== $t: fuzzing for ${secs}s (log: $log)"
  timeout -s KILL $((secs + 600)) "$bin" "${common[@]}" -max_total_time="$secs" -print_final_stats=1 \
    -dict="$(dict_of "$t")" -artifact_prefix="$artifacts" "$work" "${extras[@]}" > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  if [[ -z $execs ]]; then  # no final stats (killed): the last progress line
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  execs=${execs:-0}
  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  status=ok
  if ((rc != 0)); then
    crash=$(grep -o 'Test unit written to .*' "$log" | tail -1 | sed 's/Test unit written to //')
    what=$(grep -m1 -E '^==[0-9]+==ERROR|ERROR: libFuzzer|WOQ_FUZZ_CHECK|terminate called|runtime error|WOQ_FUZZ_STRICT' "$log")
    status="FINDING (rc $rc)"
    echo "$t: ${what:-exit status $rc} -- reproducer: ${crash:-none written} (log: $log)" >> "$results/$t.findings"
    echo "== $t: FINDING: ${what:-exit status $rc}"
    echo "   reproducer: ${crash:-none written}; rerun: $bin ${crash:-}"
    echo "   minimize:   $bin -minimize_crash=1 -runs=10000 -exact_artifact_path=/tmp/min ${crash:-}"
  fi
  printf '%-20s %12s %10s  %-22s %s\n' "$t" "$execs" "${eps:-?}" "${cov:-}" "$status" > "$results/$t.row"
  echo "$execs" > "$results/$t.execs"
}

for t in "${targets[@]}"; do
  [[ -x $build/bin/${t}_fuzz ]] || { echo "tools/fuzz.sh: $build/bin/${t}_fuzz is missing" >&2; exit 2; }
done
running=0
for t in "${targets[@]}"; do
  if ((running >= parallel)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_target "$t" &
  running=$((running + 1))
done
wait

total=0
findings=()
for t in "${targets[@]}"; do
  total=$((total + $(cat "$results/$t.execs" 2> /dev/null || echo 0)))
  while IFS= read -r line; do findings+=("$line"); done < "$results/$t.findings"
done
echo
printf '%-20s %12s %10s  %-22s %s\n' target executions exec/s coverage status
for t in "${targets[@]}"; do cat "$results/$t.row" 2> /dev/null || printf '%-20s %12s\n' "$t" 'no result'; done
printf '%-20s %12s\n' total "$total"
if ((${#findings[@]} > 0)); then
  echo
  echo "${#findings[@]} finding(s):"
  printf '  %s\n' "${findings[@]}"
  exit 1
fi
echo "no findings"
exit 0
}
