#!/usr/bin/env python3
"""lm-eval's local-completions, as a client of `woq serve`: scores ARC-Easy and
HellaSwag through /v1/completions and requires the accuracies `woq eval tasks`
gets for the same model and items.

The requests follow lm-eval 0.4's documented payloads (TemplateAPI /
LocalCompletionsAPI with a remote tokenizer; lm-eval itself is not used):
  - GET /tokenizer_info, then POST /tokenize for each context and
    context + continuation; the continuation's tokens are the whole's past the
    context's (lm-eval's _encode_pair);
  - POST /v1/completions {"model", "prompt": [[ids], [ids], ...] (a batch),
    "max_tokens": 0, "logprobs": 1, "echo": true, "temperature": 0,
    "seed": 1234}; choices sorted by "index"; the log-likelihood is the sum of
    choices[i].logprobs.token_logprobs over the continuation's positions.
The (context, continuation) pairs come from `woq eval tasks --log-samples`, so
that both sides score the same requests; acc picks the highest sum, acc_norm
the highest sum per byte of the continuation (lm-eval's definitions).
Also checks that a batch of string prompts and a single token-id prompt work.

Usage: lm_eval_client.py --woq BIN --model DIR [--limit 50]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def start_server(woq, model):
    proc = subprocess.Popen([woq, "serve", "-m", model, "--port", "0", "-t", "2"], stderr=subprocess.PIPE, text=True)
    log = ""
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log += line
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
    proc.kill()
    sys.exit(f"woq serve did not start:\n{log}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--woq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16, help="prompts per request (lm-eval's batch_size)")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        samples_path, json_path = os.path.join(tmp, "samples.jsonl"), os.path.join(tmp, "results.json")
        subprocess.run([a.woq, "eval", "tasks", "-m", a.model, "--tasks", "arc_easy,hellaswag", "--limit", str(a.limit),
                        "--num-fewshot", "0", "-t", "2", "--log-samples", samples_path, "--json", json_path],
                       check=True, stdout=subprocess.DEVNULL)
        with open(samples_path) as f:
            samples = [json.loads(line) for line in f]
        with open(json_path) as f:
            woq_results = {r["task"]: r for r in json.load(f)}

    proc, url = start_server(a.woq, a.model)
    failures = []
    try:
        info = get(url + "/tokenizer_info")
        for key in ("bos_token", "eos_token", "model_max_length"):
            if key not in info:
                failures.append(f"/tokenizer_info lacks '{key}'")
        model = get(url + "/v1/models")["data"][0]["id"]
        tokenize = lambda text: post(url + "/tokenize", {"model": model, "prompt": text})["tokens"]

        # Every (context, continuation) request, tokenized remotely as lm-eval's _encode_pair does.
        requests = []  # (sample index, choice index, whole ids, continuation length)
        for s_i, s in enumerate(samples):
            for c_i, (context, continuation) in enumerate(s["arguments"]):
                context_ids = tokenize(context)
                whole = tokenize(context + continuation)
                requests.append((s_i, c_i, whole, len(whole) - len(context_ids)))
        lls = [[None] * len(s["arguments"]) for s in samples]
        for b in range(0, len(requests), a.batch):
            batch = requests[b:b + a.batch]
            reply = post(url + "/v1/completions", {"model": model, "prompt": [r[2] for r in batch], "max_tokens": 0,
                                                   "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234})
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            if len(choices) != len(batch):
                sys.exit(f"a batch of {len(batch)} prompts got {len(choices)} choices")
            for (s_i, c_i, whole, n_cont), choice in zip(batch, choices):
                token_logprobs = choice["logprobs"]["token_logprobs"]
                if len(token_logprobs) != len(whole) or token_logprobs[0] is not None:
                    sys.exit(f"echo gave {len(token_logprobs)} prompt logprobs for {len(whole)} tokens "
                             f"(first {token_logprobs[0]!r}, expected null)")
                lls[s_i][c_i] = sum(token_logprobs[-n_cont:])

        # Accuracies as lm-eval computes them, per task, against woq eval tasks'.
        worst = 0.0
        per_task = {}
        for s, ll in zip(samples, lls):
            worst = max(worst, max(abs(x - y) for x, y in zip(ll, s["loglikelihoods"])))
            acc = int(max(range(len(ll)), key=lambda i: ll[i]) == s["target"])
            norm = [x / len(arg[1].encode()) for x, arg in zip(ll, s["arguments"])]
            acc_norm = int(max(range(len(norm)), key=lambda i: norm[i]) == s["target"])
            t = per_task.setdefault(s["task"], {"acc": [], "acc_norm": []})
            t["acc"].append(acc)
            t["acc_norm"].append(acc_norm)
            if acc != s["acc"] or acc_norm != s["acc_norm"]:
                failures.append(f"{s['task']} doc {s['doc_id']}: server acc/acc_norm {acc}/{acc_norm}, "
                                f"woq eval tasks {s['acc']}/{s['acc_norm']} (ll {ll} vs {s['loglikelihoods']})")
        for task, t in per_task.items():
            served = {m: sum(v) / len(v) for m, v in t.items()}
            want = {m: woq_results[task][m] for m in ("acc", "acc_norm")}
            print(f"{task}: {len(t['acc'])} items; served acc {served['acc']:.4f} acc_norm {served['acc_norm']:.4f}; "
                  f"woq eval tasks acc {want['acc']:.4f} acc_norm {want['acc_norm']:.4f}")
            if served != want:
                failures.append(f"{task}: served {served} != woq eval tasks {want}")
        print(f"largest |log-likelihood difference| over {len(requests)} requests: {worst:.3g}")
        if worst > 1e-4:
            failures.append(f"log-likelihoods differ by up to {worst}")
        if sorted(per_task) != ["arc_easy", "hellaswag"] or any(len(t["acc"]) != a.limit for t in per_task.values()):
            failures.append(f"expected {a.limit} items of arc_easy and hellaswag, scored {per_task.keys()}")

        # String prompts in a batch, and one token-id prompt, as lm-eval's generate_until and others send.
        texts = ["Once upon a time", "The little dog"]
        reply = post(url + "/v1/completions", {"model": model, "prompt": texts, "max_tokens": 4, "temperature": 0})
        got = [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])]
        for i, text in enumerate(texts):
            alone = post(url + "/v1/completions", {"model": model, "prompt": text, "max_tokens": 4, "temperature": 0})
            if alone["choices"][0]["text"] != got[i]:
                failures.append(f"batched prompt {i} gave {got[i]!r}, alone {alone['choices'][0]['text']!r}")
        if reply["usage"]["completion_tokens"] != 8:
            failures.append(f"usage of a batch of two 4-token completions: {reply['usage']}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
