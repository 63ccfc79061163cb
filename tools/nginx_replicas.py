#!/usr/bin/env python3
"""N `woq serve` replicas of one model behind nginx with deploy/nginx/woq.conf, on loopback.

Starts the replicas and nginx (Debian's, as any user: its files go to a temporary prefix), then checks, each a
line, exit status 1 when one fails:
  health    /health through the proxy; each replica's /metrics through /replicas/N/metrics
  stream    a stream arrives event by event through the proxy (first event long before the last)
  abort     a client that hangs up before its (long) answer cancels the replica's generation (woq_cancelled_total)
  load      C clients (half streaming) for S seconds; one replica SIGKILLed at 20 % of them and restarted at
            40 %, another SIGTERMed (drained) at 50 % and restarted at 60 % (nginx retries a replica it marked
            down after 5 s, so S >= 20). Every answer must be the greedy
            text each prompt gets from a replica asked directly; only streams that had begun on the killed
            replica may fail (counted); the restarted replicas must answer again before the end
  overload  a burst over every replica's queue: the overflow gets the replicas' 503, and the requests right after
            are answered (no replica is taken out of the pool for being busy)
  affinity  with `hash $woq_affinity consistent;` requests that start alike (or carry one X-Session-Id) reach
            one replica, and its prefix cache serves the repeated start
Python standard library only; the request helpers are serve_attack.py's.

Usage: tools/nginx_replicas.py --woq BUILD/bin/woq --model MODEL [--nginx PATH] [--replicas 3] [--clients 32]
                               [--seconds 60] [--keep DIR]
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_attack import Server  # noqa: E402

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "nginx", "woq.conf")
PROMPTS = ["Once upon a time", "Lily and Ben", "The little dog", "One day, a bird", "Tom had a red ball",
           "The sun was hot", "Mom said", "A big fish"]
TOKENS = 48


def free_port():
    """A port free now and below the kernel's ephemeral range, so that no client connection takes it while
    a killed replica is down (its restart binds it again)."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise SystemExit(f"no free port below {low}")


# One thread each (three replicas share two cores here), the default low-bit format, drained within 10 s, at most
# 4 + 16 requests each (the load below stays under it with one replica down; the overload check goes over).
REPLICA = ("-t", "1", "--parallel", "4", "--max-queue", "16", "--shutdown-timeout", "10")


def nginx_conf(ports, listen, affinity):
    """deploy/nginx/woq.conf with the test's ports, a response header naming the replica(s) tried, and
    optionally the hash balancing the file offers in a comment."""
    text = open(CONF).read()

    def sub(pattern, repl, count):
        nonlocal text
        text, n = re.subn(pattern, repl, text)
        if n != count:
            raise SystemExit(f"{CONF}: expected {count} match(es) of {pattern!r}, found {n}: update this test")

    servers = "".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;\n" for p in ports)
    sub(r"(    server 127\.0\.0\.1:800\d [^\n]*\n)+", servers, 1)
    sub(r"listen 127\.0\.0\.1:8000;", f"listen 127.0.0.1:{listen};", 1)
    metrics = "".join(f"    location = /replicas/{i + 1}/metrics {{ proxy_pass http://127.0.0.1:{p}/metrics; }}\n"
                      for i, p in enumerate(ports))
    sub(r"(    location = /replicas/\d/metrics [^\n]*\n)+", metrics, 1)
    sub(r"proxy_pass http://woq;", "proxy_pass http://woq;\n      add_header X-Woq-Replica $upstream_addr always;", 1)
    if affinity:
        sub(r"    least_conn;\n", "", 1)
        sub(r"# (hash \$woq_affinity consistent;)", r"\1", 1)
    return text


class Nginx:
    def __init__(self, nginx, prefix, conf_text):
        os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
        self.conf = os.path.join(prefix, "woq.conf")
        with open(self.conf, "w") as f:
            f.write(conf_text)
        self.log = open(os.path.join(prefix, "error.log"), "w")
        self.proc = subprocess.Popen([nginx, "-p", prefix, "-e", os.path.join(prefix, "error.log"), "-c", self.conf,
                                      "-g", "daemon off;"], stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_listening(port, proc=None, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"process exited ({proc.returncode}) before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {seconds} s")


def get(port, path, headers=None, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace"), r.getheader("X-Woq-Replica")
    finally:
        c.close()


class Answer:
    """One completion through the proxy: status, the replica(s) nginx tried, text, whether it ended well."""

    def __init__(self):
        self.status, self.replica, self.text, self.ok, self.error, self.usage = None, "", "", False, "", {}
        self.start = self.end = self.first = None
        self.events = []  # arrival times of the text events (streams)


def complete(port, prompt, stream, tokens=TOKENS, headers=None, timeout=60, abort_after=None):
    """POST /v1/completions (greedy); reads the answer (SSE events for a stream) into an Answer."""
    a = Answer()
    a.start = time.monotonic()
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": stream})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        a.status, a.replica = r.status, r.getheader("X-Woq-Replica") or ""
        if not stream or r.status != 200:
            data = r.read()
            if r.status == 200:
                reply = json.loads(data)
                a.text, a.usage = reply["choices"][0]["text"], reply.get("usage") or {}
            else:
                a.text = data.decode(errors="replace")
            a.ok = r.status == 200
            return a
        while True:
            line = r.readline()
            if not line:
                a.error = "stream cut before [DONE]"
                return a
            line = line.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                a.ok = True
                return a
            chunk = json.loads(data)
            if "error" in chunk:
                a.error = f"error event: {chunk['error']}"
                return a
            a.events.append(time.monotonic() - a.start)
            a.text += "".join(ch.get("text") or "" for ch in chunk.get("choices", []))
            if abort_after is not None and len(a.events) >= abort_after:
                a.error = "aborted by the client"
                return a
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        a.error = repr(e)
        return a
    finally:
        a.end = time.monotonic()
        c.close()


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def check_health(proxy, ports):
    status, body, _ = get(proxy, "/health")
    assert status == 200 and "ok" in body, f"/health through the proxy: {status} {body[:100]}"
    for i in range(len(ports)):
        status, body, _ = get(proxy, f"/replicas/{i + 1}/metrics")
        assert status == 200 and "woq_requests_total" in body, f"/replicas/{i + 1}/metrics: {status} {body[:100]}"
    return f"/health 200 through the proxy; /metrics of all {len(ports)} replicas through /replicas/N/metrics"


def check_stream(proxy):
    a = complete(proxy, "Once upon a time", True, tokens=300)
    assert a.ok, f"stream failed: {a.status} {a.error}"
    assert len(a.events) >= 100, f"only {len(a.events)} events"
    first, last = a.events[0], a.events[-1]
    # Token by token: the events come in many reads spread over the generation (300 tokens take 20 ms or more
    # here, more on a busy machine), not in the one burst of a proxy that holds the answer. (Not "the first
    # before half the stream's time": under load the prefill's wait can outlast this fast model's whole story.)
    distinct = len({round(t, 4) for t in a.events})
    assert last - first >= 0.01 and distinct >= 10, \
        f"events came in bursts: first at {first * 1e3:.1f} ms, last at {last * 1e3:.1f} ms, {distinct} distinct times"
    return (f"{len(a.events)} events from {a.replica}: first at {first * 1e3:.1f} ms, last at {last * 1e3:.1f} ms, "
            f"{distinct} distinct arrival times")


def cancelled_total(proxy, n):
    return sum(metric(get(proxy, f"/replicas/{i + 1}/metrics")[1], "woq_cancelled_total") for i in range(n))


def check_abort(proxy, n):
    before = cancelled_total(proxy, n)
    # A batch of 20 prompts (what a replica takes at once: --parallel 4 + --max-queue 16) of 500 tokens each keeps
    # it busy for 0.2 s or more (this model writes one story in ~40 ms); the client sends it and hangs up 50 ms
    # later, long before the answer.
    body = json.dumps({"prompt": ["Once upon a time"] * 20, "max_tokens": 500, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.05)
    hung_up = time.monotonic()
    deadline = hung_up + 5
    while time.monotonic() < deadline:
        if cancelled_total(proxy, n) > before:
            return (f"a client hung up 50 ms into a 20-prompt request: its replica cancelled the generation "
                    f"within {(time.monotonic() - hung_up) * 1e3:.0f} ms")
        time.sleep(0.02)
    raise AssertionError("no replica counted a cancelled generation 5 s after the client hung up")


def check_overload(proxy):
    """A burst over every replica's queue: the overflow gets the replicas' own 503, and the replicas stay in the
    pool (nginx does not count a 503 as a failure), so the next requests are answered at once."""
    results, lock = [], threading.Lock()

    def one():
        a = complete(proxy, "Once upon a time", False, tokens=400)
        with lock:
            results.append(a)

    threads = [threading.Thread(target=one) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    busy = [a for a in results if a.status == 503 and "retry later" in a.text.lower()]
    other = [a for a in results if not a.ok and a not in busy]
    assert busy, "no request of the burst got a 503: raise the burst"
    assert not other, f"{len(other)} failures other than a replica's 503, e.g. {other[0].status} {other[0].text[:150]}"
    after = [complete(proxy, p, False, tokens=8) for p in PROMPTS]
    bad = [a for a in after if not a.ok]
    assert not bad, f"{len(bad)} of {len(after)} requests right after the burst failed, e.g. {bad[0].status} " \
                    f"{bad[0].text[:150]}"
    return (f"100 requests at once: {len(results) - len(busy)} answered, {len(busy)} got a replica's 503 (queue "
            f"full); the {len(after)} requests right after were all answered")


KILLED, DRAINED = 1, 2  # the replicas load() disrupts


def disrupt(replicas, t0, seconds):
    """Kills, restarts, drains and restarts replicas on load()'s schedule; returns when each happened."""
    events = {}

    def at(fraction):
        time.sleep(max(0.0, t0 + fraction * seconds - time.monotonic()))
        return time.monotonic()

    events["kill"] = at(0.2)
    replicas[KILLED].proc.kill()
    replicas[KILLED].proc.wait()
    events["restart"] = at(0.4)
    replicas[KILLED] = replicas[KILLED].restarted()
    events["up"] = time.monotonic()
    events["term"] = at(0.5)
    code = replicas[DRAINED].stop(timeout=30)
    assert code == 0, f"the drained replica exited with {code}"
    events["drained"] = time.monotonic()
    at(0.6)
    replicas[DRAINED] = replicas[DRAINED].restarted()
    events["up2"] = time.monotonic()
    at(1.0)
    return events


def load(proxy, replicas, ports, want, clients, seconds):
    """The load with one replica killed and restarted and one drained and restarted (see the module doc)."""
    answers, lock, stop = [], threading.Lock(), threading.Event()

    def client(c):
        i = c
        while not stop.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            a = complete(proxy, prompt, stream=(i + c) % 2 == 0)
            a.prompt = prompt
            with lock:
                answers.append(a)
            i += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        events = disrupt(replicas, t0, seconds)
    finally:
        stop.set()
        for t in threads:
            t.join()

    killed, drained = KILLED, DRAINED
    killed_addr, drained_addr = f"127.0.0.1:{ports[killed]}", f"127.0.0.1:{ports[drained]}"
    failed = [a for a in answers if not a.ok]
    wrong = [a for a in answers if a.ok and a.text != want[a.prompt]]
    # A stream whose headers had come from the killed replica cannot be sent elsewhere: it may fail.
    excused = [a for a in failed if a.status == 200 and a.replica.split(", ")[-1] == killed_addr
               and a.start < events["kill"] < a.end]
    # A connection the draining replica had in its listen backlog gets its 503 "shutting down" (nginx passes
    # 503s on: retrying them would mark a merely busy replica as failed).
    drain_503 = [a for a in failed if a.status == 503 and a.replica.split(", ")[-1] == drained_addr
                 and a.start < events["drained"] and a.end > events["term"]]
    excused += drain_503
    retried = [a for a in answers if a.ok and "," in a.replica]
    back = sum(1 for a in answers if a.ok and a.start > events["up"] and a.replica.split(", ")[-1] == killed_addr)
    back2 = sum(1 for a in answers if a.ok and a.start > events["up2"] and a.replica.split(", ")[-1] == drained_addr)
    in_flight_killed = [a for a in answers if a.start < events["kill"] < a.end and killed_addr in a.replica]
    cut = len(excused) - len(drain_503)
    summary = (f"{len(answers)} requests by {clients} clients in {seconds} s; killed replica: {len(in_flight_killed)} "
               f"in flight ({cut} streams failed, the others retried by nginx); {len(retried)} answered after a "
               f"retry in the whole run; answered by the restarted replicas afterwards: {back} and {back2}; drain of "
               f"the third took {events['drained'] - events['term']:.2f} s ({len(drain_503)} 503 'shutting down')")
    problems = []
    if wrong:
        problems.append(f"{len(wrong)} wrong answers, e.g. {wrong[0].text!r} for {wrong[0].prompt!r} "
                        f"from {wrong[0].replica}")
    unexcused = [a for a in failed if a not in excused]
    if unexcused:
        a = unexcused[0]
        problems.append(f"{len(unexcused)} failures not in flight on the killed replica, e.g. status {a.status} "
                        f"from {a.replica!r} at {a.start - t0:.2f}..{a.end - t0:.2f} s: {a.error or a.text[:120]}")
    if back == 0 or back2 == 0:
        problems.append("a restarted replica got no requests")
    assert not problems, summary + "; " + "; ".join(problems)
    return summary


def check_affinity(proxy, ports):
    # The key is the prompt's first 256 characters: prompts with one long start and different endings.
    seen, story = {}, " ".join(PROMPTS) * 8
    for rep in range(3):
        for k, p in enumerate(PROMPTS):
            a = complete(proxy, p + ". " + story + f" Ending {rep}.", False, tokens=4)
            assert a.ok, f"{a.status} {a.error}"
            seen.setdefault(k, set()).add(a.replica)
    spread = {next(iter(r)) for r in seen.values() if len(r) == 1}
    assert all(len(r) == 1 for r in seen.values()), f"one prompt start reached several replicas: {seen}"
    assert len(spread) > 1, f"every prompt start reached one replica: {spread}"
    sessions = {}
    for rep in range(3):
        for s in range(6):
            a = complete(proxy, f"{PROMPTS[(s + rep) % len(PROMPTS)]}", False, tokens=4,
                         headers={"X-Session-Id": f"user-{s}"})
            assert a.ok, f"{a.status} {a.error}"
            sessions.setdefault(s, set()).add(a.replica)
    assert all(len(r) == 1 for r in sessions.values()), f"one X-Session-Id reached several replicas: {sessions}"
    # The prefix cache serves the repeated start on that replica (asked twice in a row: each replica's
    # cache is LRU and holds a few of these long prompts).
    for ending in (8, 9):
        a = complete(proxy, PROMPTS[0] + ". " + story + f" Ending {ending}.", False, tokens=1)
        assert a.ok and {a.replica} == seen[0], f"request went to {a.replica}, not {seen[0]}: {a.status} {a.error}"
    usage = a.usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert cached > 0.5 * usage["prompt_tokens"], f"the repeated start was not cached: {usage}"
    return (f"{len(PROMPTS)} prompt starts x 3 requests each on one replica apiece ({len(spread)} replicas used); "
            f"6 X-Session-Ids likewise; a repeated start took {cached} of {usage['prompt_tokens']} prompt tokens "
            f"from its replica's prefix cache")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--woq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--keep", help="keep nginx's prefix (config, error log) in this directory")
    args = ap.parse_args()
    if args.replicas < 3:
        ap.error("--replicas must be >= 3 (one is killed and one drained)")
    if not os.access(args.nginx, os.X_OK):
        sys.exit(f"nginx not found at {args.nginx} (bash tools/install-deps.sh installs Debian's nginx-light)")
    prefix = args.keep or tempfile.mkdtemp(prefix="woq-nginx-")
    os.makedirs(prefix, exist_ok=True)
    os.chmod(prefix, 0o755)  # nginx's workers run as nobody under root
    ports = [free_port() for _ in range(args.replicas)]
    replicas = [Server(args.woq, args.model, port=p, base=REPLICA) for p in ports]
    proxy = free_port()
    failures = 0
    nginx = None
    try:
        want = {}
        for p in PROMPTS:
            a = complete(replicas[0].port, p, False)
            assert a.ok, f"direct request to a replica failed: {a.status} {a.text}"
            want[p] = a.text
        checks = [("health", lambda: check_health(proxy, ports)), ("stream", lambda: check_stream(proxy)),
                  ("abort", lambda: check_abort(proxy, len(ports))),
                  ("load", lambda: load(proxy, replicas, ports, want, args.clients, args.seconds)),
                  ("overload", lambda: check_overload(proxy))]
        for affinity, group in ((False, checks), (True, [("affinity", lambda: check_affinity(proxy, ports))])):
            nginx = Nginx(args.nginx, prefix, nginx_conf(ports, proxy, affinity))
            wait_listening(proxy, nginx.proc, 10)
            for name, check in group:
                try:
                    print(f"{name:9} ok: {check()}", flush=True)
                except (AssertionError, RuntimeError) as e:  # RuntimeError: a replica did not start
                    failures += 1
                    print(f"{name:9} FAILED: {e}", flush=True)
            nginx.stop()
            nginx = None
    finally:
        if nginx is not None:
            nginx.stop()
        for r in replicas:
            if r.proc.poll() is None:
                r.stop()
        if failures and os.path.exists(os.path.join(prefix, "error.log")):
            print("nginx's error log (tail):\n" + open(os.path.join(prefix, "error.log")).read()[-2000:])
        if not args.keep:
            shutil.rmtree(prefix, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
