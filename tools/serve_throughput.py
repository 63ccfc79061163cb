#!/usr/bin/env python3
"""Load generator for `woq serve` (or any OpenAI-compatible server, e.g. llama-server):
CLIENTS threads each send REQUESTS streaming /v1/completions requests (greedy,
max_tokens TOKENS, distinct prompts) and the script prints generated tokens per
second of wall time, time to first token (TTFT) and time per output token
(TPOT: the gaps between streamed pieces) at p50 and p99, and the prompt tokens
the server reports it took from its prefix cache. Python standard library only.

Usage: tools/serve_throughput.py URL CLIENTS REQUESTS TOKENS [--shared-prefix WORDS [--prefixes K]]
       [--prompt-words WORDS] [--api-key KEY] [--model NAME] [--json FILE]
URL is the server's address, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
--shared-prefix starts every prompt with the same text of WORDS words (a shared
system prompt; with --prefixes, one of K such texts at random); --prompt-words
sets the length of each request's own part.
"""
import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request

WORDS = ("once upon a time there was a little dog named max who liked to run in the park with his friend "
         "lily and her big red ball one day the sun was hot and the birds sang in the tall green trees").split()


def text_of(words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def percentile(values, q):
    """The q-quantile of `values` (nearest rank); None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds):
    """Seconds as milliseconds for printing ("n/a" for None)."""
    return "n/a" if seconds is None else f"{1000 * seconds:.1f} ms"


class Streamed:
    """A streamed completion: when it was sent (time.monotonic()), when each text piece came (seconds after
    that), its text and the usage the server reported (None without one)."""

    def __init__(self, start):
        self.start, self.pieces, self.text, self.usage = start, [], "", None


def stream_completion(base, headers, body, timeout=600):
    """Sends a streaming /v1/completions request (body["stream"] set) and reads it to the end: a Streamed."""
    req = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), headers)
    out = Streamed(time.monotonic())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                out.usage = chunk["usage"]
            text = "".join(c.get("text") or "" for c in chunk.get("choices", []))
            if text:
                out.pieces.append(time.monotonic() - out.start)
                out.text += text
    return out


def connection(parser, args):
    """The server's base address and request headers from args.url and args.api_key."""
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"URL must start with http:// (got {args.url!r})")
    base = args.url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    return base, headers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("clients", type=int)
    parser.add_argument("requests", type=int)
    parser.add_argument("tokens", type=int)
    parser.add_argument("--shared-prefix", type=int, default=0, metavar="WORDS")
    parser.add_argument("--prefixes", type=int, default=1, metavar="K",
                        help="with --shared-prefix: K different shared prefixes, one drawn at random per request")
    parser.add_argument("--prompt-words", type=int, default=12, metavar="WORDS")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args()
    if min(args.clients, args.requests, args.tokens, args.prompt_words) < 1 or args.shared_prefix < 0:
        parser.error("clients, requests, tokens and --prompt-words must be at least 1, --shared-prefix at least 0")
    base, headers = connection(parser, args)
    if args.prefixes < 1 or (args.prefixes > 1 and not args.shared_prefix):
        parser.error("--prefixes must be at least 1, and more than 1 only with --shared-prefix")
    systems = [text_of(args.shared_prefix, -1 - k) + "\n" if args.shared_prefix else "" for k in range(args.prefixes)]
    totals = {"tokens": 0, "cached": 0, "prompt": 0, "latency": 0.0, "requests": 0, "errors": [], "ttft": [], "tpot": []}
    lock = threading.Lock()

    def client(c):
        for r in range(args.requests):
            seed = 1 + c * args.requests + r
            body = {"prompt": systems[random.Random(seed).randrange(args.prefixes)] + text_of(args.prompt_words, seed),
                    "max_tokens": args.tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            if args.model:
                body["model"] = args.model
            try:
                got = stream_completion(base, headers, body)
            except (urllib.error.URLError, OSError, ValueError) as e:
                detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else ""
                with lock:
                    totals["errors"].append(f"{e} {detail}".strip())
                return
            pieces = got.pieces
            with lock:
                usage = got.usage or {}
                totals["tokens"] += usage.get("completion_tokens", len(pieces))
                totals["prompt"] += usage.get("prompt_tokens", 0)
                totals["cached"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                totals["latency"] += pieces[-1] if pieces else 0.0
                totals["requests"] += 1
                if pieces:
                    totals["ttft"].append(pieces[0])
                    totals["tpot"].extend(b - a for a, b in zip(pieces, pieces[1:]))

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
    figures = {
        "clients": args.clients, "requests": totals["requests"], "completion_tokens": totals["tokens"],
        "prompt_tokens": totals["prompt"], "cached_tokens": totals["cached"], "seconds": wall,
        "tokens_per_second": totals["tokens"] / wall, "mean_latency": totals["latency"] / totals["requests"],
        "ttft_p50": percentile(totals["ttft"], 0.5), "ttft_p99": percentile(totals["ttft"], 0.99),
        "tpot_p50": percentile(totals["tpot"], 0.5), "tpot_p99": percentile(totals["tpot"], 0.99)}
    print(f"clients {args.clients}: {figures['requests']} requests, {figures['completion_tokens']} tokens in {wall:.1f} s = "
          f"{figures['tokens_per_second']:.1f} tokens/s; mean latency {figures['mean_latency']:.2f} s; "
          f"TTFT p50 {ms(figures['ttft_p50'])} p99 {ms(figures['ttft_p99'])}; "
          f"TPOT p50 {ms(figures['tpot_p50'])} p99 {ms(figures['tpot_p99'])}; "
          f"prompt tokens {figures['prompt_tokens']}, {figures['cached_tokens']} from the prefix cache")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
