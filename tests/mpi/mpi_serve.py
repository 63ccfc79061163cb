#!/usr/bin/env python3
"""`mpirun -np R woq serve` (the decoder blocks split over the ranks; rank 0 serves HTTP and schedules) against one
process, and the ways such a job ends (CTest mpi_serve).

Checks, a line each (exit status 1 when one fails):
  equal      -np 2 and -np 3 answer a mix of concurrent requests (greedy and seeded completions, prompts that
             share long prefixes so that the prefix cache reuses them, prompts prefilled in chunks, or whole in
             micro-batches, echo with prompt logprobs, chat) with one process's text and log-probabilities, byte
             for byte, with woq's numerics and a GGUF file's (ggml's); the prefix cache served tokens
  bad ids    a prompt of token ids outside the vocabulary is refused (400) and the job still answers
  drain      SIGTERM to rank 0 (its pid on a startup line) with 60 streams queued: every one ends with [DONE],
             then the other ranks stop (they ignore the signal), exit 0; SIGTERM to mpirun ends the job in seconds
  killed     rank 1 SIGKILLed mid-stream, or rank 0: the job ends within seconds (no hang)
  stuck      rank 1 SIGSTOPped, then SIGTERM to rank 0: the job ends 10 s after --shutdown-timeout, saying why
Python standard library only.

Usage: tests/mpi/mpi_serve.py --woq BUILD/bin/woq --model MODEL --gguf FILE [--mpirun mpirun]
"""
import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_eval import mpirun_args, run_checks  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Server:
    """woq serve as one process (np 1) or under mpirun -np NP, until stop()."""

    def __init__(self, args, work, np, chunk=24, extra=("--parallel", "4"), model=None):
        self.port = free_port()
        argv = [args.woq, "serve", "-m", model or args.model, "-t", "1", "--port", str(self.port), "--prefill-chunk", str(chunk),
                *extra]
        cmd = argv if np == 1 else mpirun_args(args, (np, {}, argv))
        self.log_path = os.path.join(work, f"serve{self.port}.log")
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.p.poll() is None, f"serve -np {np} exited: {self.text()[-600:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"serve -np {np} not ready in 60 s: {self.text()[-600:]}")

    def text(self):
        self.log.flush()
        return open(self.log_path).read()

    def ranks(self):
        """Pids of the woq processes of this job (rank 0 first) by OMPI_COMM_WORLD_RANK."""
        found = {}
        for pid in os.listdir("/proc"):
            try:
                if not pid.isdigit() or os.getsid(int(pid)) != self.p.pid:
                    continue
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        found[int(e.split(b"=")[1])] = int(pid)
            except OSError:
                continue
        return [found[r] for r in sorted(found)]

    def stop(self, sig=signal.SIGTERM, timeout=30, pid=None):
        """Sends `sig` to `pid` (default: mpirun, or the one process) and waits for the job to end."""
        if self.p.poll() is None:
            os.kill(pid or self.p.pid, sig)
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            raise AssertionError(f"still running {timeout} s after signal {sig}")
        return self.p.returncode


def requests():
    """(path, body) pairs: the mix every server answers."""
    story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
             "friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog took it first. ")
    out = []
    for i, tail in enumerate(["She was sad.", "The dog was happy.", "Lily laughed and", "Her mom said",
                              "They played all day and", "The sun was hot, so"]):
        # Shared 60-token prefix: later ones reuse the earlier ones' keys and values.
        out.append(("/v1/completions", {"prompt": story + tail, "max_tokens": 24 + 3 * i, "temperature": 0,
                                        "logprobs": 2}))
    for i, start in enumerate(["Tim had a toy car.", "The cat sat on the mat.", "A bird flew over the house."]):
        out.append(("/v1/completions", {"prompt": start, "max_tokens": 40, "temperature": 0.9, "seed": 11 + i}))
    out.append(("/v1/completions", {"prompt": story, "max_tokens": 1, "echo": True, "logprobs": 1,
                                    "temperature": 0}))
    out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story about a frog."}],
                                         "max_tokens": 30, "temperature": 0}))
    out.append(("/v1/completions", {"prompt": story * 3, "max_tokens": 16, "temperature": 0}))
    return out


def answers(port, reqs):
    """Every request's choices (the answer less its id, time and usage), sent 6 at a time."""
    def one(req):
        status, body = post(port, *req)
        assert status == 200, f"{req[0]}: HTTP {status}: {body}"
        return json.dumps(body["choices"], sort_keys=True), body["usage"].get("prompt_tokens_details", {})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        return list(pool.map(one, reqs))


def cached_tokens(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("woq_prefix_cache_hit_tokens_total"):
                return float(line.split()[-1])
    return 0.0


def check_equal(args, work):
    reqs = requests()
    out = []
    # --prefill-chunk 0: whole prompts in one pass, which a pipeline runs in micro-batches. A GGUF file (ggml's
    # numerics, where a lone decode row's order differs unless the passes are batch-invariant, on every rank).
    for model, runs in ((args.model, ((2, 24), (3, 24), (2, 0))), (args.gguf, ((2, 24),))):
        one = Server(args, work, 1, model=model)
        try:
            want = [a for a, _ in answers(one.port, reqs)]
        finally:
            one.stop()
        for np, chunk in runs:
            srv = Server(args, work, np, chunk, model=model)
            try:
                for rnd in range(2):  # the second round reuses the first's prompts from the prefix cache
                    got = [a for a, _ in answers(srv.port, reqs)]
                    got[0] = answers(srv.port, reqs[:1])[0][0]  # alone: each decode pass is one row
                    for i, (g, w) in enumerate(zip(got, want)):
                        assert g == w, (f"-np {np} {model} round {rnd + 1} request {i} {reqs[i][1]}: "
                                        f"{g[:300]} != {w[:300]}")
                hits = cached_tokens(srv)
                assert hits > 0, f"-np {np}: the prefix cache served no tokens"
                assert "woq: pipeline over" in srv.text(), srv.text()[-400:]
                # SIGTERM to rank 0 (mpirun itself exits 1 on a SIGTERM of its own, whatever its ranks do).
                assert srv.stop(pid=srv.ranks()[0]) == 0, f"-np {np}: exit status {srv.p.returncode}: {srv.text()[-400:]}"
            finally:
                srv.stop()
            out.append(f"-np {np} --prefill-chunk {chunk}{' (GGUF)' if model == args.gguf else ''}: {len(reqs)} "
                       f"requests x 2 rounds, {hits:.0f} prompt tokens from the prefix cache")
    return "; ".join(out) + "; all as one process, byte for byte"


def check_bad_ids(args, work):
    srv = Server(args, work, 2)
    try:
        status, body = post(srv.port, "/v1/completions", {"prompt": [1, 99999, 5], "max_tokens": 4})
        assert status == 400, f"HTTP {status}: {body}"
        status, body = post(srv.port, "/v1/completions", {"prompt": "Once upon", "max_tokens": 4, "temperature": 0})
        assert status == 200, f"after the refusal: HTTP {status}: {body}"
    finally:
        assert srv.stop(pid=srv.ranks()[0]) == 0, srv.text()[-400:]
    return "token id 99999: HTTP 400; the next request answered; exit 0"


def stream(port, max_tokens, prompt="Once upon a time"):
    """Opens a streamed completion and reads its first event; returns the response to read on."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=30)
    assert r.readline().startswith(b"data: "), "no first event"
    return r


def check_drain(args, work):
    # Rank 0 named by its startup line; 60 streams queued behind --parallel 1, most of them still to run when
    # it gets SIGTERM: every one must end with [DONE] (mpirun would kill the ranks 2 s after a signal of its own).
    srv = Server(args, work, 2, extra=["--parallel", "1", "--shutdown-timeout", "60"])
    pid = int(re.search(r"woq: rank 0 is pid (\d+)", srv.text()).group(1))
    assert pid == srv.ranks()[0], (pid, srv.ranks())
    ends, signalled = [], []

    def one(i):
        try:
            r = stream(srv.port, 400, f"Story {i}: once upon a time")
            rest = r.read().decode()
            ends.append(("data: [DONE]" in rest, bool(signalled)))
        except OSError as e:
            ends.append((f"error: {e}", bool(signalled)))

    with concurrent.futures.ThreadPoolExecutor(60) as pool:
        for i in range(60):
            pool.submit(one, i)
        time.sleep(0.5)
        signalled.append(time.monotonic())
        rc = srv.stop(signal.SIGTERM, pid=pid, timeout=60)
    secs = time.monotonic() - signalled[0]
    log = srv.text()
    assert len(ends) == 60 and all(done is True for done, _ in ends), f"streams cut: {[e for e in ends if e[0] is not True][:3]}"
    assert "woq: terminated; stopping" in log and "error" not in log, log[-500:]
    assert rc == 0, f"exit status {rc}: {log[-500:]}"
    after = sum(1 for _, late in ends if late)
    # mpirun's own SIGTERM: forwarded, then the ranks are killed; the job ends in seconds either way.
    srv2 = Server(args, work, 2)
    t = time.monotonic()
    rc2 = srv2.stop(signal.SIGTERM)
    secs2 = time.monotonic() - t
    assert secs2 < 15, f"mpirun: took {secs2:.1f} s"
    return (f"SIGTERM to rank 0 (pid from its startup line): all 60 queued streams ended with [DONE] ({after} of "
            f"them after the signal), exit {rc} {secs:.1f} s after; SIGTERM to mpirun: exit {rc2} {secs2:.1f} s after")


def check_killed(args, work):
    out = []
    for victim in (1, 0):
        srv = Server(args, work, 2)
        pids = srv.ranks()
        assert len(pids) == 2, f"ranks found: {pids}"
        stop = False

        def load():  # requests one after another until the job is gone
            while not stop:
                try:
                    stream(srv.port, 400).read()
                except OSError:
                    time.sleep(0.05)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for _ in range(3):
                pool.submit(load)
            time.sleep(1)
            os.kill(pids[victim], signal.SIGKILL)
            t = time.monotonic()
            try:
                rc = srv.stop(signal.SIGCONT, timeout=20)  # not a stop signal: waits for the job to end
            finally:
                stop = True
            secs = time.monotonic() - t
        assert rc != 0, f"exit 0 after rank {victim} was killed"
        assert secs < 15, f"took {secs:.1f} s"
        out.append(f"rank {victim}: exit {rc} in {secs:.1f} s")
    return "SIGKILL while 3 clients stream, " + ", ".join(out)


def check_stuck(args, work):
    # Rank 1 stopped (SIGSTOP: a rank that no longer answers) mid-stream, then SIGTERM to rank 0: the drain cannot
    # finish, so the job ends 10 s after --shutdown-timeout with rank 0's error, rather than hang.
    srv = Server(args, work, 2, extra=["--parallel", "4", "--shutdown-timeout", "1"])
    pids = srv.ranks()
    os.kill(pids[1], signal.SIGSTOP)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: stream(srv.port, 400).read())
        time.sleep(0.5)
        t = time.monotonic()
        try:
            rc = srv.stop(signal.SIGTERM, pid=pids[0], timeout=40)
        finally:
            try:
                os.kill(pids[1], signal.SIGKILL)
            except OSError:
                pass
        secs = time.monotonic() - t
        try:
            pending.result(timeout=10)
        except Exception:
            pass  # cut: its rank ended
    log = srv.text()
    assert rc != 0 and "did not finish 11 s after the stop" in log, f"exit {rc}: {log[-500:]}"
    assert secs < 25, f"took {secs:.1f} s"
    return f"rank 1 SIGSTOPped, SIGTERM to rank 0: exit {rc} {secs:.1f} s after, with rank 0's error"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--woq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", required=True, help="a llama.cpp K-quant file (tests/data/gguf_kquant/tiny-Q3_K_M.gguf)")
    ap.add_argument("--mpirun", default="mpirun")
    run_checks(ap.parse_args(), (("equal", check_equal), ("bad ids", check_bad_ids), ("drain", check_drain),
                                 ("killed", check_killed), ("stuck", check_stuck)))


if __name__ == "__main__":
    main()
