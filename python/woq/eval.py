"""Accuracy of a loaded model, as `woq eval` measures it: the same library calls, the same numbers.

    import woq
    original = woq.optimize_model(path, low_bit="fp32")
    model = woq.optimize_model(path)                          # sym_int4 group 32
    woq.eval.compare(model, original, "wiki.test.raw")       # {"mean_kl": ..., "same_top": ..., "ppl_ratio": ...}
    woq.eval.tasks(model, ["arc_easy", "piqa"], limit=200)    # {"arc_easy": {"acc": ..., "acc_norm": ...}, ...}
    woq.eval.recovery(original, [model], ["arc_easy", "piqa"], limit=200)  # {"tasks": [...], "average_recovery": ...}
    woq.eval.pareto(path, "heldout.txt", calib_file="calib.txt", output="pareto.png")  # [{"kind", "name", ...}, ...]

Each function returns the dict `woq eval ... --json` writes; with print_report=True it also prints the CLI's table.
"""

import json
import os

from . import _INT32, _UINT64, ArgumentTypeError, _bool, _int, _path, _str, _woq

__all__ = ["perplexity", "compare", "tasks", "recovery", "pareto"]


def _text(text_or_path):
    """(text, name for messages): an os.PathLike is always a file; a str is a file when it names one, else the text."""
    if isinstance(text_or_path, os.PathLike) or (
            isinstance(text_or_path, str) and "\n" not in text_or_path and len(text_or_path) < 4096
            and os.path.isfile(text_or_path)):
        path = os.fspath(text_or_path)
        try:
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace"), path
        except OSError as e:
            raise _woq.Error(f"{path}: {e.strerror}") from None
    if not isinstance(text_or_path, str):
        raise ArgumentTypeError(f"text_or_path must be a str or a path, got {type(text_or_path).__name__}")
    return text_or_path, "the text"


def _scoring(ctx, batch, chunks, bos_per_chunk, per_document):
    r = _woq.ScoringRequest()
    r.ctx, r.batch = _int(ctx, "ctx"), _int(batch, "batch")
    r.chunks = _int(chunks, "chunks", optional=True) or 0
    r.bos_per_chunk = _bool(bos_per_chunk, "bos_per_chunk")
    if _str(per_document, "per_document", optional=True) == "":
        raise ValueError("per_document must be None or a non-empty separator")
    r.per_document = per_document or ""
    return r


def _result(pair, print_report):
    text, fields = pair
    if print_report:
        print(text, end="")
    return json.loads(fields)


def perplexity(model, text_or_path, ctx=512, batch=0, chunks=None, bos_per_chunk=True, per_document=None,
               progress=True, print_report=False):
    """Perplexity of `model` on a text (or a file), as `woq eval perplexity`: llama-perplexity's chunks of `ctx`
    tokens, each scored on its second half (with BOS first when the tokenizer adds one, unless bos_per_chunk=False),
    at most `chunks` of them; or, with per_document="<sep>", each document from position 0.

    Returns {"ppl", "ppl_stderr", "mean_nll", "tokens", "sequences", "mode", "ctx", "low_bit", "model",
    "tokens_per_second"}. Raises woq.Error when the text is shorter than one chunk.
    """
    from . import _progress
    text, source = _text(text_or_path)
    request = _scoring(ctx, batch, chunks, bos_per_chunk, per_document)
    return _result(_woq.perplexity(model._engine, text, source, request, _progress(progress, "chunk")), print_report)


def compare(model, reference_model, text_or_path, ctx=512, batch=0, chunks=None, bos_per_chunk=True, per_document=None,
            progress=True, print_report=False):
    """How far `model`'s next-token distributions are from `reference_model`'s (the original, e.g.
    woq.optimize_model(path, low_bit="fp32")) on the same scored tokens, as `woq eval compare` (llama-perplexity
    --kl-divergence): mean / median / 90 % / 99 % / max KL divergence (nats), the same-top-token rate, both
    perplexities and their ratio, and RMS change of the correct token's probability. When `model` rounds its
    activations (int8, int16 or bf16) and the reference does not, its weights are run again with f32 activations
    (the weights' share).

    Returns {"mean_kl", "kl_stderr", "median_kl", "p90_kl", "p99_kl", "max_kl", "same_top", "same_top_stderr",
    "ppl", "ref_ppl", "ppl_ratio", "rms_dp", "tokens", "model", "ref_model", "low_bit", "activations",
    "weights_only_mean_kl", ...} (fractions, not percent).
    """
    from . import _progress
    text, source = _text(text_or_path)
    request = _scoring(ctx, batch, chunks, bos_per_chunk, per_document)
    return _result(_woq.compare(model._engine, reference_model._engine, text, source, request,
                                _progress(progress, "chunk")), print_report)


def _task_request(tasks, limit, num_fewshot, seed):
    """(specs, TaskOptions) of tasks(), with its checks."""
    if isinstance(tasks, str):
        specs = tasks
    elif isinstance(tasks, (bytes, bytearray)) or not hasattr(tasks, "__iter__"):
        raise ArgumentTypeError(f"tasks must be a str or a list of str, got {type(tasks).__name__}")
    else:
        specs = ",".join(_str(t, "tasks") for t in tasks)
    for name in specs.split(","):
        if "," in name or name.strip() != name:
            raise ValueError(f"task names must not have spaces: {name!r}")
    options = _woq.TaskOptions()
    num_fewshot = _int(num_fewshot, "num_fewshot", _INT32, optional=True)
    options.shots = -1 if num_fewshot is None else num_fewshot
    limit = _int(limit, "limit", optional=True)
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be None or > 0, got {limit!r}")
    options.limit = 0 if limit is None else limit
    options.seed = _int(seed, "seed", _UINT64)
    return specs, options


def tasks(model, tasks, data_dir=None, limit=None, num_fewshot=None, seed=1234, progress=True, print_report=False):
    """lm-eval-style tasks on `model`, as `woq eval tasks`: multiple choice by log-likelihood (acc, acc_norm; mc2 for
    truthfulqa_mc2), GSM8K by greedy generation (exact_match), with bootstrap standard errors.

    tasks: names (arc_easy, arc_challenge, hellaswag, piqa, winogrande, mmlu, truthfulqa_mc1, truthfulqa_mc2, gsm8k,
        "openllm" for the six Open LLM Leaderboard v1 tasks) or "name=PATH", as a list or a comma-separated str.
    data_dir: a folder with the task files (default: the files bundled with woq, woq._woq.bundled_task_data_dir).
    limit: the first N items (of each MMLU subject); num_fewshot: None = each task's default.

    Returns {task: {"task", "items", "shots", "primary_metric", "acc", "acc_stderr", ..., "model"}} in task order.
    """
    from . import _log, _progress
    specs, options = _task_request(tasks, limit, num_fewshot, seed)
    data_dir = _path(data_dir, "data_dir", optional=True)
    rows = _result(_woq.tasks(model._engine, specs, data_dir or "", options, _log if progress else None,
                              _progress(progress, "item")), print_report)
    return {row["task"]: row for row in rows}


def recovery(baseline, variants, tasks, data_dir=None, limit=None, num_fewshot=None, seed=1234, ppl_text=None,
             ctx=512, progress=True, print_report=False):
    """Each variant's task scores as a share of `baseline`'s (the original, e.g. woq.optimize_model(path,
    low_bit="fp32")), as `woq eval recovery`: per task the baseline's and each variant's primary metric with its
    standard error and recovery = variant / baseline in percent with a paired bootstrap error, their average; with
    `ppl_text` (a text or a file) each model's perplexity of it in chunks of `ctx` tokens and its recovery baseline /
    variant. `variants`: a model or a list of models; `tasks`, `data_dir`, `limit`, `num_fewshot`, `seed` as tasks().

    Returns the dict `woq eval recovery --json` writes ("baseline", "variants", "tasks", "average_recovery", and
    "perplexity" with ppl_text). Raises woq.Error when a variant's tokenizer differs from the baseline's.
    """
    from . import _log, _progress
    if not isinstance(variants, (list, tuple)):
        variants = [variants]
    specs, options = _task_request(tasks, limit, num_fewshot, seed)
    data_dir = _path(data_dir, "data_dir", optional=True)
    text, source = _text(ppl_text) if ppl_text is not None else (None, "")
    return _result(_woq.recovery(baseline._engine, [v._engine for v in variants], specs, data_dir or "", options, text,
                                 source, _int(ctx, "ctx"), _log if progress else None, _progress(progress, "item")),
                   print_report)


def pareto(path, file, calib_file=None, measurement=None, output=None, json_path=None, ctx=128, chunks=16, threads=0,
           progress=True):
    """Size against KL on `file` (held-out text) for the uniform formats, llama-quantize's rule mixes and woq's solved
    plans, as `woq eval pareto` measures them: a list of {"kind", "name", "bytes", "bits_per_weight", "predicted_kl",
    "mean_kl", "kl_stderr", "same_top", "ppl_ratio"}. path: a float model; calib_file (measured first) or
    measurement (a saved woq.quantize(measure=True) output); output: a PNG drawn by gnuplot; json_path: the points."""
    r = _woq.ParetoRequest()
    r.input, r.file = _path(path, "path"), _path(file, "file")
    r.calib_file = _path(calib_file, "calib_file", optional=True) or ""
    r.measurement = _path(measurement, "measurement", optional=True) or ""
    if bool(r.calib_file) == bool(r.measurement):
        raise ValueError("give one of calib_file (to measure) or measurement (a saved measurement)"
                         + (", not both" if r.calib_file else ""))
    r.png = _path(output, "output", optional=True) or ""
    r.json = _path(json_path, "json_path", optional=True) or ""
    r.ctx, r.chunks = _int(ctx, "ctx"), _int(chunks, "chunks")
    if r.ctx < 4 or r.chunks < 1:
        raise ValueError(f"ctx must be >= 4 and chunks >= 1, got {ctx!r} and {chunks!r}")
    from . import _log
    return json.loads(_woq.pareto(r, _int(threads, "threads", _INT32), _log if progress else None))
