#!/usr/bin/env python3
"""`mpirun -np R woq eval perplexity|compare|tasks|recovery|generate` against one process, and the ways an MPI job goes wrong (CTest mpi_eval).

Checks, a line each (exit status 1 when one fails):
  equal       -np 2 and -np 3 (chunks, and per document) print one process's perplexity JSON exactly (all but
              the speed and the rank count)
  tasks       -np 2 and -np 3 eval tasks write one process's JSON and --log-samples files byte for byte
  compare     -np 2 and -np 3 eval compare (the reference run on each rank's share, or each rank's rows of a
              --load-ref file) print one process's JSON; --save-ref across ranks is refused
  recovery    -np 2 and -np 3 eval recovery (tasks and --ppl-file) write one process's JSON byte for byte
  pipeline    -np 2, 3 and 5 generate (the decoder blocks split over the ranks) print one process's text, greedy
              and sampled with a seed, and after a long prompt prefilled in micro-batches (-np 2, 3, with each
              rank's peak RSS); more ranks than blocks is refused
  refused     a command that does not run across ranks (tokenize) is refused, naming itself
  mismatch    ranks with another command line, another binary, or another WOQ_ISA are refused, naming what differs
  rank fails  a rank that fails (a bad WOQ_ISA) ends the job within seconds with its error
  rank killed a rank SIGKILLed mid-run ends the job within seconds (mpirun reports it), no hang
Python standard library only.

Usage: tests/mpi/mpi_eval.py --woq BUILD/bin/woq --model MODEL --text FILE [--mpirun mpirun]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def mpirun_args(args, *parts):
    """mpirun [--allow-run-as-root] --oversubscribe PART [: PART ...]; each part is (np, env dict, argv); an env
    key that starts with '-' is an mpirun option of that part (-wdir DIR)."""
    cmd = [args.mpirun, "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for i, (np, env, argv) in enumerate(parts):
        if i:
            cmd.append(":")
        cmd += ["-np", str(np)]
        for k, v in env.items():
            cmd += [k, v] if k.startswith("-") else ["-x", f"{k}={v}"]  # "-wdir": an mpirun option
        cmd += argv
    return cmd


def run(cmd, timeout=120):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t


def ppl_argv(args, extra=(), json_path=None):
    argv = [args.woq, "eval", "perplexity", "-m", args.model, "-f", args.text, "-t", "1", *(extra or ["-c", "128"])]
    return argv + (["--json", json_path] if json_path else [])


def check_equal(args, work):
    out = []
    for extra in ([], ["--per-document", "\n\n", "-c", "256", "--chunks", "40"]):
        one = os.path.join(work, "one.json")
        rc, log, _ = run(ppl_argv(args, extra, one))
        assert rc == 0, f"one process failed: {log[-500:]}"
        want = json.load(open(one))
        for np in (2, 3):
            path = os.path.join(work, f"np{np}.json")
            rc, log, secs = run(mpirun_args(args, (np, {}, ppl_argv(args, extra, path))))
            assert rc == 0, f"-np {np} failed: {log[-800:]}"
            got = json.load(open(path))
            assert got["ranks"] == np, got
            for key in ("tokens_per_second", "ranks"):
                got.pop(key), want.pop(key, None)
            assert got == want, f"-np {np} {' '.join(extra)}: {got} != {want}"
            out.append(f"-np {np}{' per document' if extra else ''}: PPL {got['ppl']!r} over {got['tokens']} tokens")
    return "; ".join(out) + ", as one process"


def check_tasks(args, work):
    def argv(tag):
        return [args.woq, "eval", "tasks", "-m", args.model, "--tasks", "arc_easy,hellaswag,truthfulqa_mc2,gsm8k",
                "--limit", "12", "-t", "1", "--json", os.path.join(work, f"tasks{tag}.json"),
                "--log-samples", os.path.join(work, f"samples{tag}.jsonl")]

    rc, log, _ = run(argv(1))
    assert rc == 0, f"one process failed: {log[-500:]}"
    want = [open(os.path.join(work, f), "rb").read() for f in ("tasks1.json", "samples1.jsonl")]
    for np in (2, 3):
        rc, log, _ = run(mpirun_args(args, (np, {}, argv(f"np{np}"))))
        assert rc == 0, f"-np {np} failed: {log[-800:]}"
        got = [open(os.path.join(work, f), "rb").read() for f in (f"tasksnp{np}.json", f"samplesnp{np}.jsonl")]
        assert got[0] == want[0], f"-np {np}: the task results differ"
        assert got[1] == want[1], f"-np {np}: the logged samples differ"
    return "-np 2 and -np 3 over 12 items of ARC-Easy, HellaSwag, TruthfulQA mc2 and GSM8K: the JSON and " \
           "--log-samples files are one process's, byte for byte"


def check_compare(args, work):
    def argv(tag, *extra):
        return [args.woq, "eval", "compare", "-m", args.model, "--low-bit", "sym_int4", "-c", "128", "-t", "1",
                "--json", os.path.join(work, f"cmp{tag}.json"), *extra]

    text = ["-f", args.text]
    saved = os.path.join(work, "ref.bin")
    out = []
    # The reference run on each rank's share, then its rows of a saved reference (not the first rows: the
    # share of rank 1 starts within the file).
    for tag, extra in (("run", text + ["--chunks", "7"]), ("load", text + ["--chunks", "7", "--load-ref", saved])):
        rc, log, _ = run(argv(f"{tag}1", *extra, *(["--save-ref", saved] if tag == "run" else [])))
        assert rc == 0, f"one process ({tag}) failed: {log[-500:]}"
        want = json.load(open(os.path.join(work, f"cmp{tag}1.json")))
        for np in (2, 3):
            rc, log, _ = run(mpirun_args(args, (np, {}, argv(f"{tag}np{np}", *extra))))
            assert rc == 0, f"-np {np} ({tag}) failed: {log[-800:]}"
            got = json.load(open(os.path.join(work, f"cmp{tag}np{np}.json")))
            assert got == want, f"-np {np} ({tag}): {got} != {want}"
        out.append(f"KL {want['mean_kl']!r} over {want['tokens']} positions"
                   f"{' (and f32 activations: ' + repr(want['weights_only_mean_kl']) + ')' if 'weights_only_mean_kl' in want else ''}")
    rc, log, _ = run(mpirun_args(args, (2, {}, argv("refused", *text, "--save-ref", os.path.join(work, "x.bin")))))
    assert rc != 0 and "--save-ref is written by one process, not 2 ranks" in log, f"rc {rc}: {log[-500:]}"
    return (f"-np 2 and -np 3, the reference run on each rank's share ({out[0]}) and read from a saved file "
            f"({out[1]}): one process's JSON; --save-ref across ranks refused")


def check_recovery(args, work):
    def argv(tag):
        return [args.woq, "eval", "recovery", "-m", args.model, "--tasks", "arc_easy,hellaswag", "--limit", "10",
                "--low-bit", "sym_int4,asym_int4", "--ppl-file", args.text, "-c", "128", "-t", "1",
                "--json", os.path.join(work, f"rec{tag}.json")]

    rc, log, _ = run(argv(1), timeout=240)
    assert rc == 0, f"one process failed: {log[-500:]}"
    want = open(os.path.join(work, "rec1.json"), "rb").read()
    for np in (2, 3):
        rc, log, _ = run(mpirun_args(args, (np, {}, argv(f"np{np}"))), timeout=240)
        assert rc == 0, f"-np {np} failed: {log[-800:]}"
        got = open(os.path.join(work, f"recnp{np}.json"), "rb").read()
        assert got == want, f"-np {np}: the recovery JSON differs"
    return "-np 2 and -np 3, fp32 vs sym_int4 and asym_int4 on 10 items of ARC-Easy and HellaSwag and --ppl-file: " \
           "one process's JSON, byte for byte"


def check_pipeline(args, work):
    out = []
    for sampling in (["--temperature", "0"], ["--seed", "7"]):
        argv = [args.woq, "generate", "-m", args.model, "-p", "Once upon a time", "-n", "80", "-t", "1", *sampling]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-600:]
        want = p.stdout
        for np in (2, 3, 5):  # the bundled model has 5 decoder blocks: up to one rank per block
            p = subprocess.run(mpirun_args(args, (np, {}, argv)), capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, f"-np {np}: {p.stderr[-600:]}"
            assert p.stdout == want, f"-np {np} {' '.join(sampling)}: {p.stdout!r} != {want!r}"
        out.append(" ".join(sampling))
    # A long prompt: its prefill runs in micro-batches through the ranks (all but the last without logits).
    prompt = os.path.join(work, "long_prompt.txt")
    with open(prompt, "w") as f:
        f.write(open(args.text).read()[:700])
    argv = [args.woq, "generate", "-m", args.model, "-f", prompt, "-n", "24", "-t", "1", "--temperature", "0"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-600:]
    want, prompt_tokens = p.stdout, int(p.stderr.split("woq: prompt ")[1].split()[0])
    assert prompt_tokens >= 200, p.stderr
    for np in (2, 3):
        p = subprocess.run(mpirun_args(args, (np, {}, argv)), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"-np {np} long prompt: {p.stderr[-600:]}"
        assert p.stdout == want, f"-np {np} long prompt: {p.stdout!r} != {want!r}"
        assert f"woq: pipeline over {np} ranks, peak RSS: rank 0 blocks [0, " in p.stderr, p.stderr[-400:]
    long = f"after a {prompt_tokens}-token prompt prefilled in micro-batches over 2 and 3 ranks"
    rc, log, _ = run(mpirun_args(args, (6, {}, [args.woq, "generate", "-m", args.model, "-p", "Once", "-n", "2"])))
    assert rc != 0 and "6 ranks for a model of 5 decoder blocks" in log, f"rc {rc}: {log[-400:]}"
    return (f"generate -n 80 ({', '.join(out)}) with the blocks split over 2, 3 and 5 ranks, and {long}: one "
            f"process's text; 6 ranks for 5 blocks refused")


def check_refused(args, work):
    rc, log, _ = run(mpirun_args(args, (2, {}, [args.woq, "tokenize", "-m", args.model, "-p", "Once"])))
    assert rc != 0 and "runs 'woq tokenize', which does not run across MPI ranks" in log, f"rc {rc}: {log[-500:]}"
    rc, log, secs = run(mpirun_args(args, (1, {}, ppl_argv(args)), (1, {}, [args.woq, "tokenize", "-m", args.model,
                                                                           "-p", "Once"])))
    assert rc != 0 and "rank 1 of 2 runs 'woq tokenize'" in log and secs < 8, f"rc {rc} {secs:.1f} s: {log[-500:]}"
    return "tokenize under mpirun -np 2, and beside eval perplexity: refused, naming it"


def check_mismatch(args, work):
    copy = os.path.join(work, "woq-other")
    shutil.copy(args.woq, copy)
    with open(copy, "ab") as f:
        f.write(b"\0")  # another binary that still runs
    # Two working directories with a text.txt each: one relative path, two files (as on two machines).
    texts = []
    for d, words in (("a", 400), ("b", 300)):
        os.makedirs(os.path.join(work, d), exist_ok=True)
        with open(os.path.join(work, d, "text.txt"), "w") as f:
            f.write(open(args.text).read()[: words * 20])
        with open(os.path.join(work, d, "prompt.txt"), "w") as f:
            f.write(f"Once upon a time there were {words} birds.")
        low_bit = "sym_int8" if d == "a" else "asym_int4"  # two plans under one name
        with open(os.path.join(work, d, "plan.json"), "w") as f:
            json.dump({"woq_plan": 1, "base": {"low_bit": "sym_int4", "group_size": 32},
                       "tensors": {"model.layers.0.mlp.up_proj": {"low_bit": low_bit, "group_size": 32}}}, f)
        # The same model in each directory, one of them beside a README and a downloader's metadata (not read).
        shutil.copytree(args.model, os.path.join(work, d, "model"))
        if d == "b":
            open(os.path.join(work, d, "model", "README.md"), "w").write("not read by woq\n")
            os.makedirs(os.path.join(work, d, "model", ".cache"))
            open(os.path.join(work, d, "model", ".cache", "x.metadata"), "w").write("1234\n")
        texts.append(os.path.join(work, d))
    woq = os.path.abspath(args.woq)
    rel = [woq, "eval", "perplexity", "-m", os.path.abspath(args.model), "--file=text.txt", "-c", "64", "-t", "1"]
    cases = [("its command line", (1, {}, ppl_argv(args)), (1, {}, ppl_argv(args, ["--chunks", "5"]))),
             ("its binary", (1, {}, ppl_argv(args)), (1, {}, [copy] + ppl_argv(args)[1:])),
             ("its kernels", (1, {"WOQ_ISA": "scalar"}, ppl_argv(args)), (1, {}, ppl_argv(args))),
             ("the text to score", (1, {"-wdir": texts[0]}, rel), (1, {"-wdir": texts[1]}, rel)),
             ("the prompt", (1, {"-wdir": texts[0]}, [woq, "generate", "-m", os.path.abspath(args.model),
                                                       "--file", "prompt.txt", "-n", "2"]),
              (1, {"-wdir": texts[1]}, [woq, "generate", "-m", os.path.abspath(args.model),
                                        "--file", "prompt.txt", "-n", "2"]))]
    plan = [woq, "eval", "perplexity", "-m", os.path.abspath(args.model), "-f", os.path.abspath(args.text), "-c", "128",
            "--chunks", "4", "-t", "1", "--plan", "plan.json"]
    cases.append(("the plan (--plan)", (1, {"-wdir": texts[0]}, plan), (1, {"-wdir": texts[1]}, plan)))
    for what, a, b in cases:
        rc, log, secs = run(mpirun_args(args, a, b))
        assert rc != 0 and f"rank 1 of 2 differs from rank 0 in {what}" in log, f"{what}: rc {rc}: {log[-600:]}"
        assert secs < 30, f"{what}: took {secs:.1f} s"
    # The same model files in both directories (one with a README and hidden metadata beside them): accepted.
    same = [woq, "eval", "perplexity", "-m", "model", "-f", os.path.abspath(args.text), "-c", "128", "--chunks", "4",
            "-t", "1"]
    rc, log, _ = run(mpirun_args(args, (1, {"-wdir": texts[0]}, same), (1, {"-wdir": texts[1]}, same)))
    assert rc == 0, f"identical model copies refused: {log[-600:]}"
    # One weight file edited: refused, naming it.
    with open(os.path.join(texts[1], "model", "model.safetensors"), "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x11" * 8)
    rc, log, _ = run(mpirun_args(args, (1, {"-wdir": texts[0]}, same), (1, {"-wdir": texts[1]}, same)))
    assert rc != 0 and "in the model (-m) (file model.safetensors) it read" in log, f"rc {rc}: {log[-600:]}"
    return ("another command line, binary, WOQ_ISA, text, prompt, plan or model file (same relative path, other "
            "working directory) on rank 1: refused, naming it; identical model copies beside unread files: accepted")


def check_rank_fails(args, work):
    rc, log, secs = run(mpirun_args(args, (1, {}, ppl_argv(args)), (1, {"WOQ_ISA": "bogus"}, ppl_argv(args))))
    assert rc != 0 and "woq: error (rank 1 of 2): WOQ_ISA='bogus'" in log, f"rc {rc}: {log[-600:]}"
    assert secs < 15, f"took {secs:.1f} s"
    return f"the job ended in {secs:.1f} s with rank 1's error"


def check_rank_killed(args, work):
    # Token by token (--batch 1) over the whole text: long enough to kill a rank in the middle.
    cmd = mpirun_args(args, (2, {}, ppl_argv(args, ["--batch", "1"])))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim, deadline = None, time.time() + 20
    while victim is None and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
        for pid in os.listdir("/proc"):
            try:
                if not pid.isdigit() or os.readlink(f"/proc/{pid}/exe") != os.path.realpath(args.woq):
                    continue
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                if b"OMPI_COMM_WORLD_RANK=1" in env and f"{p.pid}".encode() in open(f"/proc/{pid}/stat", "rb").read():
                    victim = int(pid)
            except OSError:
                continue
    assert victim is not None, "rank 1 was not found"
    time.sleep(0.5)
    assert p.poll() is None, f"the run ended before the kill: {p.stdout.read()[-300:]}"
    os.kill(victim, signal.SIGKILL)
    t = time.monotonic()
    try:
        log, _ = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the job still ran 30 s after rank 1 was killed")
    secs = time.monotonic() - t
    assert p.returncode != 0, f"exit 0 after a rank was killed: {log[-300:]}"
    assert secs < 10, f"took {secs:.1f} s"
    return f"exit {p.returncode} {secs:.2f} s after rank 1 was SIGKILLed"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--woq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    run_checks(ap.parse_args(), (("equal", check_equal), ("tasks", check_tasks), ("compare", check_compare),
                                 ("recovery", check_recovery), ("pipeline", check_pipeline),
                                 ("refused", check_refused), ("mismatch", check_mismatch),
                                 ("rank fails", check_rank_fails), ("rank killed", check_rank_killed)))


def run_checks(args, checks):
    """Runs each (name, check(args, work)) in a common temporary directory, a line each; exits 1 when one fails."""
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for name, check in checks:
            try:
                print(f"{name:11} ok: {check(args, work)}", flush=True)
            except (AssertionError, OSError, subprocess.TimeoutExpired) as e:
                failures += 1
                print(f"{name:11} FAILED: {e}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
