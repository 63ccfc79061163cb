"""woq from Python: weight-only-quantized Llama-family models on the CPU.

    import woq
    model = woq.optimize_model("assets/models/stories260K")   # sym_int4, group 32, as the CLI
    print(model.generate("Once upon a time", max_new_tokens=40))

The C++ engine (woq._woq) does the work, with the same library calls as the
`woq` command line; this module adds defaults, docstrings and streaming.
Errors are woq.Error (a RuntimeError) with the CLI's messages, and ValueError
for bad arguments. Every call that runs the model releases the GIL; Ctrl-C
during generate() raises KeyboardInterrupt and leaves the model usable.
"""

import json
import os
import queue
import sys
import threading

from . import _woq

Error = _woq.Error
Tokenizer = _woq.Tokenizer

__all__ = ["Error", "Explanation", "Model", "Tokenizer", "eval", "explain", "optimize_model", "quantize"]


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
        iterator of str pieces (whole UTF-8 characters) that join to the same text. The penalties are llama.cpp's
        (repeat over the last repeat_last_n ids, prompt included) and OpenAI's presence / frequency penalties.
        """
        args = self._args(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, repeat_penalty,
                          repeat_last_n, presence_penalty, frequency_penalty)
        if stream:
            return self._stream(args)
        return self._engine.generate(*args, None)["text"]

    def chat(self, messages, max_new_tokens=256, temperature=0.6, top_k=40, top_p=0.9, seed=None, stop=None,
             stream=False, **penalties):
        """Replies to `messages` ([{"role": ..., "content": ...}, ...]) rendered with the model's chat template
        (ChatML when it has none) with the generation prompt, as woq serve and woq chat do. Returns the reply
        (or, with stream=True, an iterator of its pieces); the sampling defaults are the Llama model cards'."""
        ids = self.tokenizer.encode_with_special(self.chat_prompt(messages))  # BOS unless the template wrote it
        return self.generate(ids, max_new_tokens, temperature, top_k, top_p, seed, stop, stream, **penalties)

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
        _say(self._engine.save_pretrained(str(out_dir), bool(force)), self._progress)

    def _args(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, repeat_penalty, repeat_last_n,
              presence_penalty, frequency_penalty):
        if not isinstance(prompt, str):
            prompt = _ids(prompt)
        if isinstance(stop, str):
            stop = [stop]
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
        penalties = _woq.Penalties()
        penalties.repeat = float(repeat_penalty)
        penalties.last_n = int(repeat_last_n)
        penalties.presence = float(presence_penalty)
        penalties.frequency = float(frequency_penalty)
        return (prompt, int(max_new_tokens), float(temperature), int(top_k), float(top_p), seed, list(stop or []),
                penalties)

    def _stream(self, args):
        """Runs generate on a worker thread; yields its pieces as they come. Closing the iterator (or Ctrl-C while
        waiting) stops the worker at its next piece."""
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
                self._engine.generate(*args, on_text)
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


def _ids(ids):
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                import numpy  # noqa: F401 - integer scalars of NumPy arrays are accepted
                if hasattr(i, "dtype") and i.dtype.kind in "iu":
                    out.append(int(i))
                    continue
            except ImportError:
                pass
            raise ValueError(f"token ids must be ints, got {i!r}")
        out.append(i)
    return out


def optimize_model(path, low_bit="sym_int4", group_size=32, int4_range="full", rounding="woq", lm_head_low_bit=None,
                   activations=None, threads=0, progress=True):
    """Loads a model and stores its transformer blocks' linear layers in `low_bit`, as the CLI's -m/--low-bit do.

    path: a Hugging Face directory (float, GPTQ or compressed-tensors checkpoint) or a .gguf file.
    low_bit: sym_int4 (default; ipex-llm's optimize_model, ggml's Q4_0 with int4_range="full"), asym_int4,
        sym_int8, fp16, bf16 or fp32; a pre-quantized checkpoint's layers are used as stored.
    group_size: weights per scale (32; -1 = per output channel). int4_range: "full" [-8, 7] or "clip" [-7, 7].
    rounding: "woq" or "ggml" (llama-quantize's Q4_0 / Q8_0 rule). lm_head_low_bit: also convert lm_head (None:
        keep it as stored). activations: None (each format's default), "int8" or "f32".
    threads: worker threads (0: all cores). progress: print what loading did to stderr, as the CLI does.
    Raises woq.Error for files that cannot be loaded, ValueError for bad arguments.
    """
    request = _woq.LoadRequest()
    request.low_bit = str(low_bit)
    request.group_size = int(group_size)
    request.int4_range = str(int4_range)
    request.rounding = str(rounding)
    request.lm_head_low_bit = "" if lm_head_low_bit is None else str(lm_head_low_bit)
    request.activations = "" if activations is None else str(activations)
    engine = _woq.load(str(path), request, int(threads), _progress(progress, "layer"))
    _say(engine.summary, progress)
    return Model(engine, progress)


def _optional(value, kind, name):
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return kind(value)


def quantize(input, output, method=None, low_bit=None, group_size=None, int4_range=None, format=None, recipe=None,
             rounding=None, gptq_format=None, max_shard_gb=None, damp_percent=None, desc_act=None, static_groups=None,
             true_sequential=None, block_size=None, calib=None, calib_file=None, nsamples=None, seqlen=None, seed=None,
             force=False, resume=False, threads=0, progress=True):
    """Quantizes the checkpoint `input` into `output`, as `woq quantize -m INPUT -o OUTPUT` does with the same options.

    input: a float Hugging Face directory or .gguf file (for a .gguf output also a GPTQ checkpoint).
    output: a directory for a GPTQ checkpoint (AutoGPTQ's layout: transformers, vLLM and woq load it) or a .gguf file
        (Q4_0 / Q8_0 / F16 / BF16 / F32 linear layers, for llama.cpp); format="gptq" or "gguf" says so explicitly.
    recipe: "w8a16" (gptq, sym_int8 per channel, damp_percent 0.01, no desc_act, random calibration tokens: Neural
        Magic's Llama-2-7b w8a16 model card) or "w4a16" (gptq, sym_int4 group 128, desc_act) fills the options not
        given; each can still be set.
    method: "rtn" (round to nearest, the default) or "gptq" (calibrated: damp_percent 0.01, desc_act, static_groups,
        true_sequential, block_size 128; calib "random" = nsamples x seqlen random token ids with `seed`, or
        "random:NxL", or calib_file: a text cut into nsamples windows of seqlen tokens).
    low_bit: sym_int4 (default), asym_int4 or sym_int8 (GGUF: also fp16, bf16, fp32). group_size: None = 128 (32 for a
        GGUF input of ggml blocks), -1 = per output channel. Options left None take the CLI's defaults, and giving
        one that does not apply (a GPTQ option with method="rtn") raises ValueError, as the CLI refuses the flag.
    The output is written into a temporary directory beside it and renamed into place; an existing output is
    replaced only with force=True. GPTQ keeps each finished decoder block in .OUTPUT.partial beside it: after an
    interruption (Ctrl-C raises KeyboardInterrupt after the current block, or the process was killed),
    resume=True continues from the last finished block with the same input, options and calibration. progress: the CLI's lines on stderr and a progress bar over the decoder blocks on
    a terminal (tqdm when installed); False: silent.
    Raises ValueError for bad choices and woq.Error for files that cannot be read or written.
    """
    r = _woq.QuantizeRequest()
    r.input, r.output = os.fspath(input), os.fspath(output)
    r.format = "" if format is None else str(format)
    r.recipe = _optional(recipe, str, "recipe")
    r.low_bit = _optional(low_bit, str, "low_bit")
    r.method = _optional(method, str, "method")
    r.force = bool(force)
    r.resume = bool(resume)
    r.group_size = _optional(group_size, int, "group_size")
    r.int4_range = _optional(int4_range, str, "int4_range")
    r.rounding = _optional(rounding, str, "rounding")
    r.gptq_format = _optional(gptq_format, str, "gptq_format")
    r.max_shard_gb = _optional(max_shard_gb, float, "max_shard_gb")
    r.damp_percent = _optional(damp_percent, float, "damp_percent")
    r.desc_act = _optional(desc_act, bool, "desc_act")
    r.static_groups = _optional(static_groups, bool, "static_groups")
    r.true_sequential = _optional(true_sequential, bool, "true_sequential")
    r.block_size = _optional(block_size, int, "block_size")
    r.calib = _optional(calib, str, "calib")
    r.calib_file = None if calib_file is None else os.fspath(calib_file)
    r.nsamples = _optional(nsamples, int, "nsamples")
    r.seqlen = _optional(seqlen, int, "seqlen")
    r.seed = _optional(seed, int, "seed")
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed!r}")
    _woq.quantize(r, int(threads), _log if progress else None, _progress(progress, "layer"))


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
    text, fields = _woq.explain(reference_model._engine, model._engine, str(prompt), int(max_new_tokens), int(top))
    return Explanation(text, json.loads(fields))


from . import eval  # noqa: E402,F401 - woq.eval.perplexity / compare / tasks (uses Model above)
