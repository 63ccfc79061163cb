#!/usr/bin/env python3
"""Load generator for `woq serve`: CLIENTS threads each send REQUESTS
non-streaming /v1/completions requests (greedy, max_tokens TOKENS, distinct
prompts) and the script prints total generated tokens per second of wall time
and the mean request latency. Python standard library only.

Usage: tools/serve_throughput.py URL CLIENTS REQUESTS TOKENS [--api-key KEY] [--model NAME]
URL is the server's address, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
"""
import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("clients", type=int)
    parser.add_argument("requests", type=int)
    parser.add_argument("tokens", type=int)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    if min(args.clients, args.requests, args.tokens) < 1:
        parser.error("clients, requests and tokens must be at least 1")
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"URL must start with http:// (got {args.url!r})")
    base = args.url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    words = ["Once", "upon", "a", "time", "there", "was", "a", "little", "dog", "named", "Max"]
    totals = {"tokens": 0, "latency": 0.0, "requests": 0, "errors": []}
    lock = threading.Lock()

    def client(c):
        for r in range(args.requests):
            prompt = " ".join(words[(c + r) % len(words):] + words[: (c + r) % len(words)])
            request = {"prompt": prompt, "max_tokens": args.tokens, "temperature": 0}
            if args.model:
                request["model"] = args.model
            start = time.monotonic()
            try:
                req = urllib.request.Request(f"{base}/v1/completions", json.dumps(request).encode(), headers)
                with urllib.request.urlopen(req, timeout=600) as resp:
                    usage = json.load(resp)["usage"]
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else ""
                with lock:
                    totals["errors"].append(f"{e} {detail}".strip())
                return
            with lock:
                totals["tokens"] += usage["completion_tokens"]
                totals["latency"] += time.monotonic() - start
                totals["requests"] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    if totals["errors"]:
        print(f"{len(totals['errors'])} request(s) failed; first: {totals['errors'][0]}", file=sys.stderr)
        sys.exit(1)
    print(f"clients {args.clients}: {totals['requests']} requests, {totals['tokens']} tokens in {wall:.1f} s = "
          f"{totals['tokens'] / wall:.1f} tokens/s; mean latency {totals['latency'] / totals['requests']:.2f} s")


if __name__ == "__main__":
    main()
