#!/usr/bin/env python3
"""`mpirun -np R woq serve` (the decoder blocks split over the ranks; rank 0 serves HTTP and schedules) against one
process, and the ways such a job ends (CTest mpi_serve).

Checks, a line each (exit status 1 when one fails):
  equal      -np 2 and -np 3 answer a mix of concurrent requests (greedy and seeded completions, prompts that
             share long prefixes so that the prefix cache reuses them, prompts prefilled in chunks, or whole in
             micro-batches, echo with prompt logprobs, chat) with one process's text and log-probabilities, byte
             for byte; the prefix cache served tokens
  bad ids    a prompt of token ids outside the vocabulary is refused (400) and the job still answers
  drain      SIGTERM to rank 0 or to mpirun (which forwards it): rank 0 finishes the stream in flight and tells
             the other ranks to stop (they ignore the signal), exit 0 (mpirun's own exit status is 1)
  killed     rank 1 SIGKILLed mid-stream, or rank 0: the job ends within seconds (no hang)
Python standard library only.

Usage: tests/mpi/mpi_serve.py --woq BUILD/bin/woq --model MODEL [--mpirun mpirun]
"""
import argparse
import concurrent.futures
import json
import os
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

    def __init__(self, args, work, np, chunk=24):
        self.port = free_port()
        argv = [args.woq, "serve", "-m", args.model, "-t", "1", "--port", str(self.port), "--parallel", "4",
                "--prefill-chunk", str(chunk)]
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
    one = Server(args, work, 1)
    try:
        want = [a for a, _ in answers(one.port, reqs)]
    finally:
        one.stop()
    out = []
    # --prefill-chunk 0: whole prompts in one pass, which a pipeline runs in micro-batches.
    for np, chunk in ((2, 24), (3, 24), (2, 0)):
        srv = Server(args, work, np, chunk)
        try:
            for rnd in range(2):  # the second round reuses the first's prompts from the prefix cache
                got = [a for a, _ in answers(srv.port, reqs)]
                for i, (g, w) in enumerate(zip(got, want)):
                    assert g == w, f"-np {np} round {rnd + 1} request {i} {reqs[i][1]}: {g[:300]} != {w[:300]}"
            hits = cached_tokens(srv)
            assert hits > 0, f"-np {np}: the prefix cache served no tokens"
            assert "woq: pipeline over" in srv.text(), srv.text()[-400:]
            # SIGTERM to rank 0 (mpirun itself exits 1 on a SIGTERM of its own, whatever its ranks do).
            assert srv.stop(pid=srv.ranks()[0]) == 0, f"-np {np}: exit status {srv.p.returncode}: {srv.text()[-400:]}"
        finally:
            srv.stop()
        out.append(f"-np {np} --prefill-chunk {chunk}: {len(reqs)} requests x 2 rounds, {hits:.0f} prompt tokens "
                   "from the prefix cache")
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


def stream(port, max_tokens):
    """Opens a streamed completion and reads its first event; returns the response to read on."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=30)
    assert r.readline().startswith(b"data: "), "no first event"
    return r


def check_drain(args, work):
    out = []
    for target in ("rank 0", "mpirun"):
        srv = Server(args, work, 2)
        r = stream(srv.port, 400)
        t = time.monotonic()
        rc = srv.stop(signal.SIGTERM, pid=srv.ranks()[0] if target == "rank 0" else None)
        secs = time.monotonic() - t
        rest = r.read().decode()
        assert "data: [DONE]" in rest, f"{target}: the stream in flight was cut: {rest[-300:]}"
        log = srv.text()
        assert "woq: terminated; stopping" in log and "error" not in log, f"{target}: {log[-500:]}"
        # mpirun exits 1 after a SIGTERM of its own whatever its ranks do; rank 0's ends the job with 0.
        assert target == "mpirun" or rc == 0, f"{target}: exit status {rc}: {log[-500:]}"
        assert secs < 15, f"{target}: took {secs:.1f} s"
        out.append(f"{target}: exit {rc} {secs:.1f} s after")
    return "SIGTERM with a stream in flight (it ends with [DONE]) to " + ", ".join(out)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--woq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    run_checks(ap.parse_args(), (("equal", check_equal), ("bad ids", check_bad_ids), ("drain", check_drain),
                                 ("killed", check_killed)))


if __name__ == "__main__":
    main()
