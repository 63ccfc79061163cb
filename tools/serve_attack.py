#!/usr/bin/env python3
"""Hostile clients and hostile model files against a real `woq serve`, on loopback.

Each scenario starts from a running server, attacks it, and checks that the
server (1) is still alive with no signal, (2) kept its memory within a stated
bound (peak RSS growth, VmHWM), and (3) answers the next honest request
correctly (the same greedy text as before the attack) within 1 s. A line per
scenario; exit status 1 when any fails. Python standard library only.

Usage: tools/serve_attack.py --woq BUILD/bin/woq --model MODEL_DIR [--quick] [--only NAME,...] [--soak SECONDS]
                             [--rss-scale F]
  --quick       smaller numbers (CI): 200 slowloris connections instead of 1000, 300-connection bursts
  --soak S      also the honest load: 64 clients for S seconds, 0 errors, 0 mismatches, RSS growth < 10 %
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HONEST = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
RSS_SCALE = 1.0


class Server:
    """`woq serve -m MODEL --port PORT ARGS` (0: any free port) with its stderr collected."""

    def __init__(self, woq, model, args=(), port=0, base=("-t", "2", "--low-bit", "fp32")):
        self.woq, self.model, self.args, self.base = woq, model, args, base
        self.proc = subprocess.Popen([woq, "serve", "-m", model, "--port", str(port), *base, *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = ""
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"woq serve exited: {self.log}")
            self.log += line
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise RuntimeError("woq serve did not start")
        threading.Thread(target=self._drain, daemon=True).start()

    def restarted(self):
        """A new server like this one, on its port."""
        return Server(self.woq, self.model, self.args, self.port, self.base)

    def _drain(self):
        for line in self.proc.stderr:
            self.log += line

    def status(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def rss(self):
        return self.status("VmRSS")

    def peak(self):
        return self.status("VmHWM")

    def stop(self, timeout=20):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "hung"


def request(port, method, path, body=None, headers=None, timeout=30):
    """One request on a fresh connection; returns (status, body bytes)."""
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        reply = read_all(s)
    return parse_status(reply), reply.split(b"\r\n\r\n", 1)[-1]


def read_all(s):
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def parse_status(reply):
    m = re.match(rb"HTTP/1\.1 (\d+)", reply)
    return int(m.group(1)) if m else None


def honest(server, want=None):
    """The honest request; returns (text, seconds). Raises on a wrong or late answer."""
    t = time.time()
    status, body = request(server.port, "POST", "/v1/completions", HONEST, timeout=10)
    seconds = time.time() - t
    if status != 200:
        raise AssertionError(f"honest request answered {status}: {body[:200]!r}")
    text = json.loads(body)["choices"][0]["text"]
    if want is not None and text != want:
        raise AssertionError(f"honest answer changed: {text!r} != {want!r}")
    return text, seconds


class Scenario:
    def __init__(self, name, bound_mb):
        self.name, self.bound = name, bound_mb * (1 << 20)


def run_scenario(server, want, name, bound_mb, attack):
    """Runs attack(server) and the three checks; returns (ok, line)."""
    peak0 = server.peak()
    bound_mb = int(bound_mb * RSS_SCALE)
    detail = ""
    try:
        detail = attack(server) or ""
        if server.proc.poll() is not None:
            raise AssertionError(f"the server died: exit {server.proc.returncode}")
        grew = server.peak() - peak0
        if grew > bound_mb * (1 << 20):
            raise AssertionError(f"peak RSS grew {grew / 2**20:.0f} MB (bound {bound_mb} MB)")
        _, seconds = honest(server, want)
        if seconds > 1:
            raise AssertionError(f"the next honest request took {seconds:.2f} s")
        return True, f"ok   {name}: {detail}; peak RSS +{grew / 2**20:.0f} MB (bound {bound_mb}); next answer {seconds * 1000:.0f} ms"
    except Exception as e:  # noqa: BLE001 - every failure is reported
        return False, f"FAIL {name}: {e} {detail}"


# ---------------------------------------------------------------- attacks

def deep_json(server):
    body = '{"messages":[{"role":"user","content":"hi","x":' + "[" * 20000 + "]" * 20000 + "}]}"
    status, reply = request(server.port, "POST", "/v1/chat/completions", body.encode())
    assert status == 400, (status, reply[:200])
    return f"20000-deep field -> {status}"


def chunked_flood(server):
    mib = 64
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
    sent = 0
    try:
        for _ in range(mib):
            s.sendall(chunk)
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        reply = read_all(s)
    except ConnectionResetError:
        reply = b""
    s.close()
    status = parse_status(reply)
    assert status == 413, f"chunked {mib} MiB body: {status} {reply[:100]!r}"
    return f"{sent} of {mib} MiB sent before the 413"


def many_messages(server):
    n = (30 << 20) // 3
    body = b'{"messages":[' + b"{}," * (n - 1) + b"{}]}"
    status, reply = request(server.port, "POST", "/v1/chat/completions", body)
    assert status == 400, (status, reply[:200])
    return f"{len(body) >> 20} MiB of empty messages -> {status}"


def pipelined(server):
    one = json.dumps(HONEST).encode()
    data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(one)).encode() + b"\r\n\r\n" + one
            + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(data)
        reply = read_all(s)
    statuses = re.findall(rb"HTTP/1\.1 (\d+)", reply)
    assert statuses == [b"200"] * 3, statuses
    order = [reply.find(b'"status"'), reply.find(b'"text_completion"'), reply.find(b'"object":"list"')]
    assert -1 not in order and order == sorted(order), order
    return "3 pipelined requests answered in order"


def declared_bodies(server):
    # Declared sizes cost nothing until the bytes arrive: 40 connections "sending" 32 MiB each.
    socks = []
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        head = b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n" if i % 2 else b"Content-Length: 33554432\r\n\r\n{"
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + head)
        socks.append(s)
    time.sleep(0.3)
    try:
        honest(server)
    finally:
        for s in socks:
            s.close()
    return "40 connections declaring 32 MiB bodies; honest POST answered"


def log_injection(server):
    status, _ = request(server.port, "GET", "/v1/models/x%0awoq:%20FORGED%20line")
    assert status == 404, status
    time.sleep(0.2)
    assert "\nwoq: FORGED" not in server.log, "a client forged a log line"
    status, _ = request(server.port, "POST", "/v1/completions", b"{}", {"Transfer-Encoding": "gzip, chunked"})
    assert status in (400, 501), status
    return f"%0a in a path stays on its log line; Transfer-Encoding gzip -> {status}"


def slowloris(count):
    def attack(server):
        socks = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        stop = threading.Event()

        def dribble():  # one byte a second on every connection
            while not stop.is_set():
                for s in socks:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
                stop.wait(1)

        t = threading.Thread(target=dribble, daemon=True)
        t.start()
        latencies = []
        started = time.time()
        try:
            while time.time() - started < 12:  # past the 10 s header timeout
                latencies.append(honest(server)[1])
                time.sleep(0.5)
        finally:
            stop.set()
            t.join()
        closed = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                if s.recv(100) == b"":
                    closed += 1
            except OSError:
                closed += 1
            s.close()
        assert max(latencies) < 1, f"honest requests took up to {max(latencies):.2f} s beside {count} slow connections"
        assert closed == count, f"only {closed} of {count} slow connections were closed after the header timeout"
        return (f"{count} slow connections; honest latency max {max(latencies) * 1000:.0f} ms over {len(latencies)} requests; "
                f"all {closed} closed by the header timeout")
    return attack


def burst(count, hold=0):
    """`count` connections at once sending GET /health; `hold` idle ones opened first."""
    def attack(server):
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(hold)]
        time.sleep(0.2)
        results = {}
        lock = threading.Lock()

        def one():
            try:
                status, _ = request(server.port, "GET", "/health", timeout=20)
                key = str(status)
            except ConnectionResetError:
                key = "reset"
            except OSError as e:
                key = type(e).__name__
            with lock:
                results[key] = results.get(key, 0) + 1

        threads = [threading.Thread(target=one) for _ in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in held:
            s.close()
        time.sleep(0.5)  # the server sees the closes
        bad = {k: v for k, v in results.items() if k not in ("200", "503")}
        assert not bad, f"{results}"
        if hold:
            assert results.get("503", 0) > 0, f"no 503 over the connection limit: {results}"
        return f"{count} connections at once ({hold} idle held): {results}"
    return attack


def no_max_tokens(server):
    # A context of millions of tokens: the cache grows with the sequence, not with the context.
    status, reply = request(server.port, "POST", "/v1/completions", {"prompt": "Hi", "temperature": 0, "stop": ["."]})
    assert status == 200, (status, reply[:200])
    return f"no max_tokens with a {server.ctx}-token context -> {status}, {json.loads(reply)['usage']['completion_tokens']} tokens"


def hostile_template(server):
    lines = []
    for messages, expect in server.cases:
        t = time.time()
        status, reply = request(server.port, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
        assert status == expect, (status, reply[:300])
        lines.append(f"{status} in {time.time() - t:.2f} s")
    return "template attacks -> " + ", ".join(lines)


def shutdown(woq, model):
    """SIGTERM with queued and running streams and a slow client: all streams end with [DONE], exit 0."""
    server = Server(woq, model, ["--parallel", "1", "--shutdown-timeout", "1"])
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\n")
    results = [None] * 12

    def stream(i):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 1.0, "seed": i, "stream": True}).encode()
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
                results[i] = read_all(s)
        except OSError as e:
            results[i] = repr(e).encode()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    t0 = time.time()
    code = server.stop(timeout=15)
    took = time.time() - t0
    for t in threads:
        t.join()
    slow.close()
    assert code == 0, f"exit {code} after {took:.1f} s: {server.log[-500:]}"
    assert took < 5, f"shutdown took {took:.1f} s"
    ended = sum(r.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") for r in results)
    errors = sum(b"shutting down" in r for r in results)
    assert ended == len(results), f"{len(results) - ended} streams were cut: {[r[-80:] for r in results]}"
    return f"exit 0 in {took:.2f} s; {ended} streams ended with [DONE] ({errors} with a shutting-down error event)"


def soak(server, want, seconds):
    errors, mismatches, done = [], 0, 0
    lock = threading.Lock()
    rss0 = server.rss()
    stop = time.time() + seconds

    def client():
        nonlocal mismatches, done
        while time.time() < stop:
            try:
                status, body = request(server.port, "POST", "/v1/completions", HONEST)
                text = json.loads(body)["choices"][0]["text"] if status == 200 else None
                with lock:
                    done += 1
                    if status != 200:
                        errors.append(status)
                    elif text != want:
                        mismatches += 1
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rss1 = server.rss()
    growth = (rss1 - rss0) / rss0
    ok = not errors and mismatches == 0 and growth < 0.10
    return ok, (f"{'ok  ' if ok else 'FAIL'} soak: 64 clients {seconds} s, {done} requests, {len(errors)} errors, "
                f"{mismatches} mismatches, RSS {rss0 >> 20} -> {rss1 >> 20} MB ({growth * 100:+.1f} %)")


def combining_marks(woq, work):
    """Issue 29 finding 1: a Qwen tokenizer (NFC normalizer) with a 32 K context; two ~400 KB prompts of one
    letter and 200 000 combining marks occupy both tokenizing workers (utf8proc's quadratic canonical ordering
    held them for minutes). The honest request must be answered within 1 s while they run, and each hostile
    request must get its 400 context_length_exceeded within 10 s (both bounds x --rss-scale)."""
    model = os.path.join(work, "qwen-32k")
    subprocess.run([woq, "make-random", "--preset", "tiny-qwen3", "-o", model], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = 32768
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config, f)
    s = Server(woq, model, ["-c", "32768", "--parallel", "1"])
    try:
        hostile = {"prompt": "a" + "\u0301\u0316" * 100000, "max_tokens": 1}
        answers = []

        def attack():
            t = time.time()
            try:
                status, body = request(s.port, "POST", "/v1/completions", hostile, timeout=30)
                answers.append((status, time.time() - t, body[:300]))
            except OSError as e:
                answers.append((None, time.time() - t, str(e).encode()))

        threads = [threading.Thread(target=attack) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        t0 = time.time()
        status, body = request(s.port, "POST", "/v1/completions",
                               {"prompt": "Hello", "max_tokens": 4, "temperature": 0}, timeout=10)
        honest_s = time.time() - t0
        for t in threads:
            t.join()
        if status != 200:
            raise AssertionError(f"honest request answered {status}: {body[:200]!r}")
        # An AddressSanitizer build (--rss-scale 4) runs the tokenizer several times slower.
        if honest_s > RSS_SCALE:
            raise AssertionError(f"the honest request took {honest_s:.2f} s while the hostile ones ran")
        for status, seconds, body in answers:
            if status != 400 or b"context_length_exceeded" not in body or seconds > 10 * RSS_SCALE:
                raise AssertionError(f"a hostile prompt got {status} after {seconds:.1f} s: {body!r}")
        # A prompt over --max-prompt-bytes (8 MiB) is refused before it is tokenized.
        t0 = time.time()
        status, body = request(s.port, "POST", "/v1/completions", {"prompt": "a" * (9 << 20), "max_tokens": 1}, timeout=30)
        if status != 400 or b"--max-prompt-bytes" not in body:
            raise AssertionError(f"a 9 MiB prompt got {status}: {body[:200]!r}")
        big_s = time.time() - t0
        return (f"honest answer {honest_s * 1000:.0f} ms beside two 400 KB combining-mark prompts "
                f"(refused in {max(a[1] for a in answers) * 1000:.0f} ms); a 9 MiB prompt refused in {big_s * 1000:.0f} ms")
    finally:
        s.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--woq", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="")
    p.add_argument("--soak", type=int, default=0)
    p.add_argument("--rss-scale", type=float, default=1.0,
                   help="multiply the memory bounds (4 for an AddressSanitizer build: its quarantine keeps freed memory)")
    a = p.parse_args()
    global RSS_SCALE
    RSS_SCALE = a.rss_scale
    only = set(filter(None, a.only.split(",")))
    results = []
    work = tempfile.mkdtemp(prefix="woq-attack-")
    try:
        server = Server(a.woq, a.model, ["--max-connections", "4096"])
        want, _ = honest(server)
        n = 200 if a.quick else 1000
        scenarios = [
            ("deep_json", 64, deep_json),
            ("chunked_flood", 100, chunked_flood),
            ("many_messages", 100, many_messages),
            ("pipelined", 16, pipelined),
            ("declared_bodies", 64, declared_bodies),
            ("log_injection", 16, log_injection),
            ("burst", 64, burst(300 if a.quick else 1000)),
            ("slowloris", 64, slowloris(n)),
        ]
        for name, bound, attack in scenarios:
            if not only or name in only:
                results.append(run_scenario(server, want, name, bound, attack))
        if a.soak and (not only or "soak" in only):
            results.append(soak(server, want, a.soak))
        code = server.stop()
        results.append((code == 0, f"{'ok  ' if code == 0 else 'FAIL'} SIGTERM after the attacks: exit {code}"))

        if not only or "connection_limit" in only:
            limited = Server(a.woq, a.model, ["--max-connections", "50"])
            results.append(run_scenario(limited, want, "connection_limit", 64, burst(200, hold=50)))
            limited.stop()

        if not only or "no_max_tokens" in only:
            big = os.path.join(work, "big-context")
            shutil.copytree(a.model, big)
            with open(os.path.join(big, "config.json")) as f:
                config = json.load(f)
            config["max_position_embeddings"] = 4 << 20
            with open(os.path.join(big, "config.json"), "w") as f:
                json.dump(config, f)
            s = Server(a.woq, big, ["--parallel", "4"])
            m = re.search(r"\((\d+) sequences at once, (\d+) tokens each", s.log)
            s.ctx = int(m.group(2))
            results.append(run_scenario(s, want, "no_max_tokens", 64, no_max_tokens))
            s.stop()

        if not only or "hostile_template" in only:
            hostile = os.path.join(work, "hostile-template")
            shutil.copytree(a.model, hostile)
            template = ("{% if messages[0].content == 'fpe' %}{{ (-9223372036854775807 - 1) // -1 }}"
                        "{% elif messages[0].content == 'loop' %}{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"
                        "{% elif messages[0].content == 'deep' %}{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}"
                        "{% elif messages[0].content == 'double' %}{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
                        "{% else %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}")
            with open(os.path.join(hostile, "tokenizer_config.json"), "w") as f:
                json.dump({"chat_template": template}, f)
            s = Server(a.woq, hostile)
            s.cases = [([{"role": "user", "content": c}], 500) for c in ("fpe", "loop", "deep", "double")]
            s.cases.append(([{"role": "user", "content": "Once upon a time"}], 200))
            results.append(run_scenario(s, want, "hostile_template", 256, hostile_template))
            s.stop()

        if not only or "combining_marks" in only:
            try:
                results.append((True, "ok   combining_marks: " + combining_marks(a.woq, work)))
            except Exception as e:  # noqa: BLE001
                results.append((False, f"FAIL combining_marks: {e}"))

        if not only or "shutdown" in only:
            try:
                results.append((True, "ok   shutdown: " + shutdown(a.woq, a.model)))
            except Exception as e:  # noqa: BLE001
                results.append((False, f"FAIL shutdown: {e}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for _, line in results:
        print(line)
    failed = sum(not ok for ok, _ in results)
    print(f"{len(results) - failed} of {len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
