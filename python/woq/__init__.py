"""woq from Python: weight-only-quantized Llama-family models on the CPU.

    import woq
    model = woq.optimize_model("assets/models/stories260K")   # sym_int4, group 32, as the CLI
    print(model.generate("Once upon a time", max_new_tokens=40))

The C++ engine (woq._woq) does the work, with the same library calls as the
`woq` command line; this module adds defaults, docstrings and streaming.
Errors are woq.Error (a RuntimeError) with the CLI's messages, ValueError for
bad argument values and TypeError (woq.ArgumentTypeError, also a ValueError)
for arguments of the wrong type, naming the argument. Every call that runs the model releases the GIL; Ctrl-C
during generate() raises KeyboardInterrupt and leaves the model usable.
"""

import contextlib
import json
import math
import os
import queue
import re
import sys
import threading

import numbers


def _choose_blas_kernels():
    """OpenBLAS's kernels by the CPU's features, the rule woq::choose_blas_kernels (src/kernels/blas.h) applies in
    the CLI, set before the engine loads OpenBLAS (which reads OPENBLAS_CORETYPE once, when it is loaded): the
    module and the CLI then compute the same bits, at AVX-512 speed on CPUs newer than the OpenBLAS release."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return
    if {"avx512f", "avx512cd", "avx512dq", "avx512bw", "avx512vl"} <= set(flags):
        os.environ["OPENBLAS_CORETYPE"] = "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"


_choose_blas_kernels()

from . import _woq  # noqa: E402 (after the BLAS choice)

Error = _woq.Error
Tokenizer = _woq.Tokenizer

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64 = (0, (1 << 64) - 1)


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (bytes for a str, a float for an int, ...): a TypeError, and also a ValueError
    (what woq raised for some of them before)."""


# The argument checks every public function runs before calling the engine: the type (TypeError naming the
# argument) and whether the engine's C++ integer holds the value (ValueError naming the argument); the engine checks
# the meaning of the values (ValueError with the CLI's message).

def _describe(value):
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _int(value, name, bounds=_INT64, optional=False):
    """`value` as an int (a bool is not one; NumPy's integers are) within `bounds`, the engine's integer type."""
    what = "an int"  # (None, where allowed, is the default: the messages stay those of woq before)
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be {what}, got {_describe(value)}")
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} must be {what} in [{bounds[0]}, {bounds[1]}], got {value}")
    return value


# A flag where a message names one: not inside a word or a path (Hugging Face's cache holds "models--org--name").
_FLAG = re.compile(r"(?<![\w/.-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_BOOL_FLAGS = ("force", "resume")


_RENAMED_FLAGS = {"max_shard_size": "max_shard_gb"}


def _keywords(text):
    """The library's text with the CLI's flag names as this module's keyword arguments: "--group-size" becomes
    "group_size", "--force" "force=True", "--max-shard-size" "max_shard_gb"."""
    def keyword(m):
        name = m.group(1).replace("-", "_")
        name = _RENAMED_FLAGS.get(name, name)
        return f"{name}=True" if name in _BOOL_FLAGS else name
    return _FLAG.sub(keyword, text)


@contextlib.contextmanager
def _keyword_errors():
    """Re-raises the library's errors (woq.Error, ValueError) with flag names as keywords (_keywords)."""
    try:
        yield
    except (ValueError, _woq.Error) as e:
        message = _keywords(str(e))
        if message == str(e):
            raise
        raise type(e)(message) from None


def _float(value, name, optional=False):
    """`value` as a float: an int or a float (not a bool or a str)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {'None or ' if optional else ''}a number, got {_describe(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float: {value}") from None


def _bool(value, name, optional=False):
    if optional and value is None:
        return None
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be {'None, ' if optional else ''}True or False, got {_describe(value)}")
    return value


def _str(value, name, optional=False):
    if optional and value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be {'None or ' if optional else ''}a str, got {_describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate ('\ud800') has no UTF-8 form
        raise ValueError(f"{name} is not valid Unicode text: {e.reason} at index {e.start}") from None
    return value


def _path(value, name, optional=False):
    """A file system path: a str or an os.PathLike naming one (not bytes, not None)."""
    if optional and value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be {'None, ' if optional else ''}a str or an os.PathLike, got "
                                f"{_describe(value)}")
    if "\0" in value:
        raise ValueError(f"{name} must not contain a NUL character")
    return value

__all__ = ["ArgumentTypeError", "Error", "Explanation", "Model", "Tokenizer", "eval", "explain", "optimize_model",
           "quantize"]


def _say(lines, progress):
    if progress:
        for line in lines:
            _log(line)


def _log(line):
    print("woq: " + line, file=sys.stderr, flush=True)


class _TqdmBar:
    """A progress(done, total) callback drawing a tqdm bar (created at the first call, when the total is known)."""

    def __init__(self, tqdm, what):
        self._tqdm = tqdm
        self._what = what
        self._bar = None

    def __call__(self, done, total):
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc="woq: " + self._what, unit=self._what, delay=1.0, leave=False)
        self._bar.update(done - self._bar.n)
        if done >= total:  # the next call starts the next bar (compare's candidate after its reference)
            self._bar.close()
            self._bar = None


def _progress(progress, what):
    """What the engine gets for a progress argument: None (silent: progress=False, or stderr is not a terminal), a
    tqdm bar when tqdm is installed, else True (the engine's own line, "woq: WHAT done/total (s, ETA s)")."""
    if not progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return True
    return _TqdmBar(tqdm, what)


class Model:
    """A loaded model (make one with woq.optimize_model)."""

    def __init__(self, engine, progress):
        self._engine = engine
        self._progress = progress

    @property
    def low_bit(self):
        """The woq format(s) of the transformer blocks' linear layers as loaded, e.g. "sym_int4"."""
        return self._engine.low_bit

    @property
    def label(self):
        """What the linear layers are, from the checkpoint and the load options (as the CLI's tables say)."""
        return self._engine.label

    @property
    def config(self):
        """The model's configuration as a dict of Hugging Face config.json fields."""
        return json.loads(self._engine.config_json)

    @property
    def tokenizer(self):
        """The model's tokenizer: encode(text, add_special=True) -> list[int], decode(ids) -> str."""
        return self._engine.tokenizer

    @property
    def context_limit(self):
        """The longest sequence (prompt + generated tokens) the model runs."""
        return self._engine.context_limit

    def generate(self, prompt, max_new_tokens=64, temperature=0.0, top_k=40, top_p=0.95, seed=None, stop=None,
                 stream=False, repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0):
        """Continues `prompt` (a str, tokenized with BOS as the tokenizer adds it, or a list of token ids).

        Returns the generated text (str), without the prompt; greedy when temperature == 0 (the default), else
        sampled with top_k / top_p and `seed` (None: random). Stops at the model's end-of-generation tokens, at
        any string of `stop` (not included), after max_new_tokens, or at the context. With stream=True, returns an
        iterator of str pieces (whole UTF-8 characters) that join to the same text. The penalties are llama.cpp's:
        repeat, presence and frequency over the last repeat_last_n ids, the prompt's included (-1: all, 0: off).
        """
        args = self._args(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, repeat_penalty,
                          repeat_last_n, presence_penalty, frequency_penalty)
        return self._stream(args, False) if stream else self._engine.generate(*args, None)["text"]

    def chat(self, messages, max_new_tokens=256, temperature=0.6, top_k=40, top_p=0.9, seed=None, stop=None,
             stream=False, **penalties):
        """Replies to `messages` ([{"role": ..., "content": ...}, ...]) rendered with the model's chat template
        (ChatML when it has none) with the generation prompt, as woq serve and woq chat do. Returns the reply
        (or, with stream=True, an iterator of its pieces); the sampling defaults are the Llama model cards'.
        The model keeps the conversation's KV cache between calls: messages that extend the last call's (and
        its reply) prefill only what was added, with the same result as a fresh prefill."""
        ids = self.tokenizer.encode_with_special(self.chat_prompt(messages))  # BOS unless the template wrote it
        args = self._args(ids, max_new_tokens, temperature, top_k, top_p, seed, stop,
                          penalties.pop("repeat_penalty", 1.0), penalties.pop("repeat_last_n", 64),
                          penalties.pop("presence_penalty", 0.0), penalties.pop("frequency_penalty", 0.0))
        if penalties:
            raise TypeError(f"chat() got unexpected keyword arguments {sorted(penalties)}")
        return self._stream(args, True) if stream else self._engine.generate(*args, None, True)["text"]

    def chat_prompt(self, messages):
        """The text `messages` render to with the model's chat template and the generation prompt."""
        if not isinstance(messages, (list, tuple)):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return self._engine.chat_prompt(json.dumps(list(messages)), True)

    def logits(self, ids):
        """Logits of one forward pass over `ids` (list of ints) from an empty KV cache, as a NumPy float32
        array [len(ids), vocab]."""
        return self._engine.logits(_ids(ids))

    def save_pretrained(self, out_dir, force=False):
        """Writes the model as a GPTQ checkpoint in `out_dir`, as `woq quantize` does with the model's format and
        group size (round to nearest: the integers this model runs with); woq, transformers and vLLM load it.
        The output goes through a temporary directory renamed into place; an existing `out_dir` is replaced only
        with force=True. Raises ValueError for a model loaded from a quantized checkpoint or in a float format."""
        _say(self._engine.save_pretrained(_path(out_dir, "out_dir"), _bool(force, "force")), self._progress)

    def _args(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, repeat_penalty, repeat_last_n,
              presence_penalty, frequency_penalty):
        if isinstance(prompt, str):
            prompt = _str(prompt, "prompt")
        else:
            prompt = _ids(prompt, "prompt", "a str or a list of token ids (ints)")
        if stop is None or isinstance(stop, str):
            stop = [] if stop is None else [stop]
        elif isinstance(stop, (bytes, bytearray, dict, set, frozenset)) or not hasattr(stop, "__iter__"):
            raise ArgumentTypeError(f"stop must be None, a str or a list of str, got {_describe(stop)}")
        stop = [_str(s, "stop") for s in stop]
        penalties = _woq.Penalties()
        penalties.repeat = _float(repeat_penalty, "repeat_penalty")
        penalties.last_n = _int(repeat_last_n, "repeat_last_n")
        penalties.presence = _float(presence_penalty, "presence_penalty")
        penalties.frequency = _float(frequency_penalty, "frequency_penalty")
        if seed is not None and _int(seed, "seed", optional=True, bounds=(_INT64[0], _UINT64[1])) < 0:
            raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
        return (prompt, _int(max_new_tokens, "max_new_tokens"), _float(temperature, "temperature"),
                _int(top_k, "top_k", _INT32), _float(top_p, "top_p"), None if seed is None else int(seed), stop,
                penalties)

    def _stream(self, args, keep_cache):
        """Runs generate on a worker thread (keep_cache: on the conversation's KV cache); yields its pieces as they
        come. Closing the iterator (or Ctrl-C while waiting) stops the worker at its next piece."""
        pieces = queue.Queue()
        cancel = threading.Event()
        done = object()

        class _Cancelled(Exception):
            pass

        def on_text(piece):
            if cancel.is_set():
                raise _Cancelled()
            pieces.put(piece)

        failure = []

        def work():
            try:
                self._engine.generate(*args, on_text, keep_cache)
            except _Cancelled:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(e)
            finally:
                pieces.put(done)

        def iterate():
            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            try:
                while True:
                    piece = pieces.get()
                    if piece is done:
                        break
                    yield piece
            finally:
                cancel.set()
                worker.join()
            if failure:
                raise failure[0]

        return iterate()


def _ids(ids, name="ids", what="a list of token ids (ints)"):
    """Token ids for the engine: a list (or any iterable but a str or bytes) of ints (NumPy's too) within int32."""
    # A dict or a set iterates its keys (a set in no fixed order): not a sequence of ids.
    if isinstance(ids, (str, bytes, bytearray, memoryview, dict, set, frozenset)) or not hasattr(ids, "__iter__"):
        raise ArgumentTypeError(f"{name} must be {what}, got {_describe(ids)}")
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise ArgumentTypeError(f"token ids must be ints, got {_describe(i)}")
        i = int(i)
        if not _INT32[0] <= i <= _INT32[1]:
            raise ValueError(f"{name}: token id {i} is outside the vocabulary")
        out.append(i)
    return out


def _checked_tokenizer_methods():
    """The Tokenizer's methods with the same argument checks as the rest of the API (the engine's own would take
    bytes for text and give pybind's TypeError for ids beyond int32)."""
    encode, encode_with_special, decode, token_text = (
        Tokenizer.encode, Tokenizer.encode_with_special, Tokenizer.decode, Tokenizer.token_text)

    def checked_encode(self, text, add_special=True):
        """Token ids of `text` (a str), with the special tokens the tokenizer adds (BOS) when add_special."""
        return encode(self, _str(text, "text"), _bool(add_special, "add_special"))

    def checked_encode_with_special(self, text):
        """Token ids of a rendered chat prompt (a str): special tokens' text becomes their ids, BOS first unless
        the text begins with it."""
        return encode_with_special(self, _str(text, "text"))

    def checked_decode(self, ids):
        """The text of `ids` (a list of ints); special tokens give nothing."""
        return decode(self, _ids(ids))

    def checked_token_text(self, id):  # noqa: A002 - the engine's name
        """The text one token stands for ("<ID?>" outside the vocabulary)."""
        return token_text(self, _int(id, "id", _INT32))

    Tokenizer.encode = checked_encode
    Tokenizer.encode_with_special = checked_encode_with_special
    Tokenizer.decode = checked_decode
    Tokenizer.token_text = checked_token_text


_checked_tokenizer_methods()


def optimize_model(path, low_bit=None, group_size=32, int4_range="full", rounding=None, lm_head_low_bit=None,
                   activations=None, plan=None, threads=0, progress=True, numerics=None):
    """Loads a model and stores its transformer blocks' linear layers in `low_bit`, as the CLI's -m/--low-bit do.

    path: a Hugging Face directory (float, GPTQ, AWQ or compressed-tensors checkpoint) or a .gguf file.
    low_bit: None (the default: sym_int4, ipex-llm's optimize_model, ggml's Q4_0 with int4_range="full"; a
        quantized GGUF file's float layers run as stored), sym_int4, asym_int4, sym_int8, fp16, bf16 or fp32; a
        pre-quantized checkpoint's layers are used as stored.
    group_size: weights per scale (32; -1 = per output channel). int4_range: "full" [-8, 7] or "clip" [-7, 7].
    rounding: None (woq's), "woq" or "ggml" (llama-quantize's Q4_0 / Q8_0 rule; ggml's block formats, q4_1,
        q5_1 and the K-quants, take "ggml" only). lm_head_low_bit: also convert lm_head (None:
        keep it as stored). activations: None (each format's default), "int8", "int16", "f32" or "bf16".
    plan: each linear layer's format from a plan file (woq.quantize(target_kl=...) writes one) or a llama-quantize
        file type ("q4_k_m": its rule), instead of low_bit (the CLI's --plan).
    numerics: None (the checkpoint's: "ggml" for a GGUF file, "woq" otherwise), "woq" (the same bits on every ISA)
        or "ggml" (norms, RoPE, SiLU and attention rounded as llama.cpp's CPU backend rounds them).
    threads: worker threads (0: all cores). progress: print what loading did to stderr, as the CLI does.
    Raises woq.Error for files that cannot be loaded, ValueError for bad arguments.
    """
    path = _path(path, "path")
    request = _woq.LoadRequest()
    request.plan = _path(plan, "plan", optional=True) or ""
    if plan is not None and (group_size != 32 or int4_range != "full" or rounding is not None):
        raise ValueError("plan sets every linear layer's format (group size, range and rounding included): leave out "
                         "group_size, int4_range and rounding")
    request.low_bit = _str(low_bit, "low_bit", optional=True) or ""
    if low_bit == "":
        raise ValueError('low_bit must be None (the default) or a format name, got ""')
    request.group_size = _int(group_size, "group_size")
    request.int4_range = _str(int4_range, "int4_range")
    request.rounding = _str(rounding, "rounding", optional=True) or ""
    if rounding == "":
        raise ValueError('rounding must be None (the default: woq\'s) or "woq" / "ggml", got ""')
    request.lm_head_low_bit = _str(lm_head_low_bit, "lm_head_low_bit", optional=True) or ""
    request.activations = _str(activations, "activations", optional=True) or ""
    if activations == "":
        raise ValueError('activations must be None (each format\'s default), "int8", "int16", "f32" or "bf16", got ""')
    request.numerics = _str(numerics, "numerics", optional=True) or ""
    if numerics == "":
        raise ValueError('numerics must be None (the checkpoint\'s), "woq" or "ggml", got ""')
    with _keyword_errors():
        engine = _woq.load(path, request, _int(threads, "threads", _INT32), _progress(progress, "layer"))
    _say([_keywords(line) for line in engine.summary], progress)
    return Model(engine, progress)


def quantize(input, output, method=None, low_bit=None, group_size=None, int4_range=None, format=None, recipe=None,
             rounding=None, gptq_format=None, max_shard_gb=None, damp_percent=None, desc_act=None, static_groups=None,
             true_sequential=None, block_size=None, calib=None, calib_file=None, nsamples=None, seqlen=None, seed=None,
             force=False, resume=False, threads=0, progress=True, target_kl=None, target_bpw=None, measure=False,
             measurement=None, verify_file=None, refine=None, candidates=None, plan=None, estimate=False, awq_grid=None,
             no_clip=False, awq_search_tokens=None, estimate_rows=None, awq_propagate=None):
    """Quantizes the checkpoint `input` into `output`, as `woq quantize -m INPUT -o OUTPUT` does with the same options.

    input: a float Hugging Face directory or .gguf file (for a .gguf output also a GPTQ checkpoint).
    output: a directory for a GPTQ checkpoint (AutoGPTQ's layout: transformers, vLLM and woq load it) or a .gguf file
        (Q4_0 / Q8_0 / F16 / BF16 / F32 linear layers, for llama.cpp); format="gptq" or "gguf" says so explicitly;
        format="awq" writes AutoAWQ's GEMM layout (asym_int4 or sym_int4, group_size 128 by default; the layers AWQ
        cannot pack stay float, listed in modules_to_not_convert).
    recipe: "w8a16" (gptq, sym_int8 per channel, damp_percent 0.01, no desc_act, random calibration tokens: Neural
        Magic's Llama-2-7b w8a16 model card) or "w4a16" (gptq, sym_int4 group 128, desc_act) fills the options not
        given; each can still be set.
    method: "rtn" (round to nearest, the default) or "gptq" (calibrated: damp_percent 0.01, desc_act, static_groups,
        true_sequential, block_size 128; calib "random" = nsamples x seqlen random token ids with `seed`, or
        "random:NxL", or calib_file: a text cut into nsamples windows of seqlen tokens), "awq" (activation-aware
        scales searched over awq_grid exponents (20), each loss on awq_search_tokens calibration tokens (512;
        0: all), folded into the norms, weight clipping unless no_clip=True, then round to nearest; calibrated as
        GPTQ; awq_propagate: the next block's inputs, "float" (default, AutoAWQ's order) or "quantized") or
        "awq+gptq" (AWQ's scales and clipping, then GPTQ with its options).
    low_bit: sym_int4 (default; asym_int4 for format="awq"), asym_int4 or sym_int8 (GGUF: also fp16, bf16, fp32). group_size: None = 128 (32 for a
        GGUF input of ggml blocks), -1 = per output channel. Options left None take the CLI's defaults, and giving
        one that does not apply (a GPTQ option with method="rtn") raises ValueError, as the CLI refuses the flag.
    The output is written into a temporary directory beside it and renamed into place; an existing output is
    replaced only with force=True. GPTQ and AWQ keep each finished decoder block in .OUTPUT.partial beside it: after an
    interruption (Ctrl-C raises KeyboardInterrupt after the current block, or the process was killed),
    resume=True continues from the last finished block with the same input, options and calibration. progress: the CLI's lines on stderr and a progress bar over the decoder blocks on
    a terminal (tqdm when installed); False: silent.
    Plan search (woq quantize --measure / --target-kl / --target-bpw): measure=True writes to `output` (JSON) each
        linear layer's KL contribution per candidate format on calib_file text (an untied model's lm_head and
        input embeddings too); target_kl (mean KL, nats per token)
        or target_bpw (bits per weight, embeddings counted) writes to `output` the plan that meets it, verified on
        verify_file (held-out text) against the float model, from a saved `measurement` or measured first;
        nsamples / seqlen: at most that many chunks of that many tokens (16 x 128); refine: re-solves when the
        verified KL misses target_kl (3); candidates: "all" or "gguf" (formats a GGUF file holds); estimate=True:
        one candidate's KL per layer, the others scaled by output error on estimate_rows calibration rows (256, one
        from each of that many equal stretches; 0: all) (the CLI's --estimate, --estimate-rows). Load the plan
        with optimize_model(path, plan=output); write it as GGUF with quantize(path, "out.gguf", plan=output).
    Raises ValueError for bad choices and woq.Error for files that cannot be read or written.
    """
    if measure or target_kl is not None or target_bpw is not None:
        given = {k: v for k, v in dict(method=method, low_bit=low_bit, group_size=group_size, int4_range=int4_range,
                                        format=format, recipe=recipe, rounding=rounding, gptq_format=gptq_format,
                                        max_shard_gb=max_shard_gb, damp_percent=damp_percent, desc_act=desc_act,
                                        static_groups=static_groups, true_sequential=true_sequential,
                                        block_size=block_size, calib=calib, seed=seed, plan=plan, awq_grid=awq_grid,
                                        awq_search_tokens=awq_search_tokens, awq_propagate=awq_propagate,
                                        no_clip=no_clip or None).items()
                 if v is not None}
        if given or resume:
            raise ValueError(f"{', '.join(given) or 'resume'} does not apply to a plan search (measure / target_kl / "
                             "target_bpw)")
        p = _woq.PlanRequest()
        p.input, p.output = _path(input, "input"), _path(output, "output")
        p.force = _bool(force, "force")
        p.measure_only = _bool(measure, "measure")
        p.target_kl = _float(target_kl, "target_kl", optional=True)
        p.target_bpw = _float(target_bpw, "target_bpw", optional=True)
        p.measurement = _path(measurement, "measurement", optional=True) or ""
        p.calib_file = _path(calib_file, "calib_file", optional=True) or ""
        p.verify_file = _path(verify_file, "verify_file", optional=True) or ""
        if seqlen is not None:
            p.ctx = _int(seqlen, "seqlen")
        if nsamples is not None:
            p.chunks = _int(nsamples, "nsamples")
        if refine is not None:
            p.refine = _int(refine, "refine", _INT32)
        if candidates is not None:
            p.candidates = _str(candidates, "candidates")
        p.estimate = _bool(estimate, "estimate")
        p.estimate_rows = _int(estimate_rows, "estimate_rows", (0, _INT64[1]), optional=True)
        for name, value in (("target_kl", p.target_kl), ("target_bpw", p.target_bpw)):
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
        with _keyword_errors():
            _woq.plan_search(p, _int(threads, "threads", _INT32), _log if progress else None)
        return
    for name, value in (("measurement", measurement), ("verify_file", verify_file), ("refine", refine),
                        ("candidates", candidates), ("estimate", estimate or None), ("estimate_rows", estimate_rows)):
        if value is not None:
            raise ValueError(f"{name} belongs to a plan search: give measure=True, target_kl or target_bpw")
    r = _woq.QuantizeRequest()
    r.input, r.output = _path(input, "input"), _path(output, "output")
    r.format = _str(format, "format", optional=True) or ""
    r.recipe = _str(recipe, "recipe", optional=True)
    r.low_bit = _str(low_bit, "low_bit", optional=True)
    r.plan = _path(plan, "plan", optional=True)
    r.method = _str(method, "method", optional=True)
    r.force = _bool(force, "force")
    r.resume = _bool(resume, "resume")
    r.group_size = _int(group_size, "group_size", optional=True)
    r.int4_range = _str(int4_range, "int4_range", optional=True)
    r.rounding = _str(rounding, "rounding", optional=True)
    r.gptq_format = _str(gptq_format, "gptq_format", optional=True)
    r.max_shard_gb = _float(max_shard_gb, "max_shard_gb", optional=True)
    r.damp_percent = _float(damp_percent, "damp_percent", optional=True)
    r.desc_act = _bool(desc_act, "desc_act", optional=True)
    r.static_groups = _bool(static_groups, "static_groups", optional=True)
    r.true_sequential = _bool(true_sequential, "true_sequential", optional=True)
    r.block_size = _int(block_size, "block_size", optional=True)
    r.calib = _str(calib, "calib", optional=True)
    r.calib_file = _path(calib_file, "calib_file", optional=True)
    r.nsamples = _int(nsamples, "nsamples", optional=True)
    r.seqlen = _int(seqlen, "seqlen", optional=True)
    r.seed = _int(seed, "seed", (_INT64[0], _UINT64[1]), optional=True)
    r.awq_grid = _int(awq_grid, "awq_grid", _INT32, optional=True)
    r.awq_search_tokens = _int(awq_search_tokens, "awq_search_tokens", optional=True)
    r.awq_propagate = _str(awq_propagate, "awq_propagate", optional=True)
    if _bool(no_clip, "no_clip"):
        r.awq_clip = False
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed!r}")
    with _keyword_errors():
        _woq.quantize(r, _int(threads, "threads", _INT32), _log if progress else None, _progress(progress, "layer"))


class Explanation:
    """What woq.explain found: text() is `woq explain`'s report; the fields are its --json keys (original_text,
    quantized_text, diverges_at (-1: identical), near_tie, original_top / quantized_top ([{"token", "p"}] at the
    divergence), kl (per generated token), layers ([{"layer", "linear", "output_error", "weight_error",
    "weights_only_output_error"}], largest output error first), model, ref_model, low_bit, ref_low_bit, prompt)."""

    def __init__(self, text, fields):
        self._text = text
        self.__dict__.update(fields)
        self.fields = fields

    def text(self):
        """The report as `woq explain` prints it."""
        return self._text

    def __repr__(self):
        return self._text


def explain(reference_model, model, prompt, max_new_tokens=48, top=10):
    """Why `model`'s output differs from `reference_model`'s (the original, e.g. optimize_model(path, "fp32")):
    both generate greedily from `prompt`; the Explanation gives where they first diverge, the original's top-2 there
    (a near tie means the flip is expected and harmless), the KL divergence per generated token and the linear
    layers with the largest quantization error on this text, as `woq explain` does."""
    text, fields = _woq.explain(reference_model._engine, model._engine, _str(prompt, "prompt"),
                                _int(max_new_tokens, "max_new_tokens"), _int(top, "top"))
    return Explanation(text, json.loads(fields))


from . import eval  # noqa: E402,F401 - woq.eval.perplexity / compare / tasks (uses Model above)
