#!/usr/bin/env python3
"""Latency scenarios for `woq serve` (or another OpenAI-compatible server), streaming /v1/completions:

  prefix URL [--words N] [--tokens T] [--seed S]
      A two-turn conversation: a prompt of N words (default 800; text from --seed), then the same prompt
      followed by the first answer and a new question. Prints both times to first token (TTFT), their
      ratio, the prompt tokens the server took from its prefix cache per turn, and a digest of the two
      answers (the same with the cache on and off: run it against both servers with the same --seed).
  chunked URL [--streams S] [--words N] [--tokens T] [--delay D]
      S streams (default 4) decode T tokens each (default 400); D seconds later (default 3) a prompt of N
      new random words arrives. Prints the streams' time per output token (TPOT, the gaps between streamed
      pieces) at p50 and p99 before it arrived and while it was prefilled, and their ratios. The streams
      must still be decoding when it arrives: on a fast model raise T and lower D.

Python standard library only; the helpers are serve_throughput.py's. Prompt tokens the server reports as
cached (usage.prompt_tokens_details.cached_tokens, woq serve's prefix cache) are printed with each figure.
"""
import argparse
import hashlib
import os
import random
import sys
import threading
import time
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_throughput import connection, ms, percentile, stream_completion, text_of  # noqa: E402


def body(args, prompt, tokens):
    b = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}}
    if args.model:
        b["model"] = args.model
    return b


def cached(got):
    return ((got.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def prefix(args, base, headers):
    first_prompt = text_of(args.words, args.seed)
    first = stream_completion(base, headers, body(args, first_prompt, args.tokens))
    second = stream_completion(base, headers,
                               body(args, first_prompt + first.text + "\n" + text_of(20, args.seed + 1), args.tokens))
    if not first.pieces or not second.pieces:
        sys.exit("a turn generated no text")
    digest = hashlib.sha256((first.text + "\0" + second.text).encode()).hexdigest()[:16]
    print(f"turn 1: {(first.usage or {}).get('prompt_tokens', '?')} prompt tokens ({cached(first)} cached), "
          f"TTFT {first.pieces[0]:.3f} s; "
          f"turn 2: {(second.usage or {}).get('prompt_tokens', '?')} prompt tokens ({cached(second)} cached), "
          f"TTFT {second.pieces[0]:.3f} s = {100 * second.pieces[0] / first.pieces[0]:.1f} % of turn 1; "
          f"answers {digest}")


def chunked(args, base, headers):
    results = [None] * args.streams
    errors = []

    def stream(i):
        try:
            results[i] = stream_completion(base, headers, body(args, text_of(12, 100 + i), args.tokens))
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    time.sleep(args.delay)
    long_sent = time.monotonic()
    long = stream_completion(base, headers, body(args, text_of(args.words, random.randrange(1 << 30)), 1))
    long_done = long_sent + (long.pieces[0] if long.pieces else 0)
    for t in threads:
        t.join()
    if errors or any(r is None for r in results):
        sys.exit(f"a stream failed: {errors[:1]}")
    before, during = [], []
    for r in results:
        times = [r.start + p for p in r.pieces]
        for a, b in zip(times, times[1:]):
            if b <= long_sent:
                before.append(b - a)
            elif a < long_done:
                during.append(b - a)
    if not before or not during:
        sys.exit("the long prompt did not arrive while the streams decoded: raise --tokens or lower --delay")
    print(f"{args.streams} streams; a {(long.usage or {}).get('prompt_tokens', '?')}-token prompt ({cached(long)} "
          f"cached) prefilled in {long_done - long_sent:.2f} s. TPOT before: p50 {ms(percentile(before, 0.5))}, "
          f"p99 {ms(percentile(before, 0.99))}; during: p50 {ms(percentile(during, 0.5))}, "
          f"p99 {ms(percentile(during, 0.99))} (p50 {percentile(during, 0.5) / percentile(before, 0.5):.2f}x, "
          f"p99 {percentile(during, 0.99) / percentile(before, 0.99):.2f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["prefix", "chunked"])
    parser.add_argument("url")
    parser.add_argument("--words", type=int, default=800, help="words of the first turn (prefix) or the long prompt")
    parser.add_argument("--seed", type=int, default=0, help="prefix: the text's seed")
    parser.add_argument("--tokens", type=int, default=0, help="tokens per answer (default: 16 prefix, 400 chunked)")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--delay", type=float, default=3.0, help="chunked: seconds before the long prompt is sent")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    if args.words < 1 or args.tokens < 0 or args.streams < 1 or args.delay < 0:
        parser.error("--words and --streams must be at least 1, --tokens and --delay at least 0")
    args.tokens = args.tokens or (16 if args.scenario == "prefix" else 400)
    base, headers = connection(parser, args)
    try:
        (prefix if args.scenario == "prefix" else chunked)(args, base, headers)
    except urllib.error.HTTPError as e:
        sys.exit(f"the server answered {e.code}: {e.read().decode(errors='replace')}")
    except (urllib.error.URLError, OSError) as e:
        sys.exit(f"cannot reach {base}: {e}")


if __name__ == "__main__":
    main()
