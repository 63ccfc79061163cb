#!/usr/bin/env python3
"""Load generator for `woq serve`: CLIENTS threads each send REQUESTS
non-streaming /v1/completions requests (greedy, max_tokens TOKENS, distinct
prompts) and the script prints total generated tokens per second of wall time
and the mean request latency. Python standard library only.

Usage: tools/serve_throughput.py URL CLIENTS REQUESTS TOKENS
"""
import json
import sys
import threading
import time
import urllib.request


def main():
    url, clients, requests, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    words = ["Once", "upon", "a", "time", "there", "was", "a", "little", "dog", "named", "Max"]
    totals = {"tokens": 0, "latency": 0.0, "requests": 0}
    lock = threading.Lock()

    def client(c):
        for r in range(requests):
            prompt = " ".join(words[(c + r) % len(words):] + words[: (c + r) % len(words)])
            body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0}).encode()
            start = time.monotonic()
            req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as resp:
                usage = json.load(resp)["usage"]
            with lock:
                totals["tokens"] += usage["completion_tokens"]
                totals["latency"] += time.monotonic() - start
                totals["requests"] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    print(f"clients {clients}: {totals['requests']} requests, {totals['tokens']} tokens in {wall:.1f} s = "
          f"{totals['tokens'] / wall:.1f} tokens/s; mean latency {totals['latency'] / totals['requests']:.2f} s")


if __name__ == "__main__":
    main()
