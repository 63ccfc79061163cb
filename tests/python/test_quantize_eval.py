"""woq.quantize, woq.eval.*, woq.explain and the progress bars against the CLI (the same library calls, so the same
files and numbers), with the bad arguments and interrupts users meet.

Run by ctest (python_api) with PYTHONPATH=build/python, WOQ_BIN and WOQ_SOURCE set."""
import inspect
import json
import os
import pty
import re
import subprocess
import sys
import types

import pytest

import woq

SOURCE = os.environ["WOQ_SOURCE"]
BIN = os.environ["WOQ_BIN"]
MODEL = os.path.join(SOURCE, "assets", "models", "stories260K")
TEXT = os.path.join(SOURCE, "tests", "data", "tinystories_heldout.txt")
PROMPT = "Once upon a time"


def cli(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    return r


def cli_json(tmp_path, *args):
    out = tmp_path / "cli.json"
    r = cli(*args, "--json", str(out))
    assert r.returncode == 0, r.stderr
    return r, json.loads(out.read_text())


def files_of(directory):
    return {p: (directory / p).read_bytes() for p in sorted(os.listdir(directory))}


@pytest.mark.parametrize("python_args,cli_args", [
    (dict(method="gptq", low_bit="asym_int4", group_size=64, calib="random:4x64", seed=3, desc_act=True),
     ["--method", "gptq", "--low-bit", "asym_int4", "--group-size", "64", "--calib", "random:4x64", "--seed", "3",
      "--desc-act"]),
    (dict(method="gptq", low_bit="sym_int8", group_size=-1, damp_percent=0.05, calib_file=TEXT, nsamples=3,
          seqlen=100, true_sequential=True),
     ["--method", "gptq", "--low-bit", "sym_int8", "--group-size", "-1", "--damp-percent", "0.05", "--calib-file",
      TEXT, "--nsamples", "3", "--seqlen", "100", "--true-sequential"]),
    (dict(), []),
])
def test_quantize_writes_the_files_the_cli_writes(tmp_path, python_args, cli_args):
    woq.quantize(MODEL, tmp_path / "py", progress=False, **python_args)
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "cli"), *cli_args)
    assert r.returncode == 0, r.stderr
    py_files, cli_files = files_of(tmp_path / "py"), files_of(tmp_path / "cli")
    assert py_files.keys() == cli_files.keys() and "model.safetensors" in py_files
    for name in py_files:
        assert py_files[name] == cli_files[name], name
    config = json.loads(py_files["config.json"])["quantization_config"]
    assert config["bits"] == (8 if python_args.get("low_bit") == "sym_int8" else 4)
    assert config["group_size"] == python_args.get("group_size", 128)


def test_quantize_to_gguf_writes_the_file_the_cli_writes(tmp_path):
    woq.quantize(MODEL, tmp_path / "py.gguf", low_bit="sym_int8", rounding="ggml", progress=False)
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "cli.gguf"), "--low-bit", "sym_int8", "--rounding", "ggml")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "py.gguf").read_bytes() == (tmp_path / "cli.gguf").read_bytes()
    m = woq.optimize_model(tmp_path / "py.gguf", progress=False)
    assert m.low_bit.startswith("sym_int8")  # down_proj (K = 172) is F16 in the file, loaded as sym_int4


def test_quantize_says_what_the_cli_says(tmp_path, capfd):
    woq.quantize(MODEL, tmp_path / "out", method="gptq", calib="random:2x32")
    err = capfd.readouterr().err
    assert "woq: GPTQ calibration: 2 sequences x 32 tokens" in err
    assert "woq: layer 5/5 quantized" in err and f"woq: wrote {tmp_path / 'out'} (GPTQ v1, sym_int4 group_size 128" in err
    woq.quantize(MODEL, tmp_path / "quiet", progress=False)
    assert capfd.readouterr().err == ""


def test_flag_names_in_paths_are_left_alone(tmp_path):
    # Hugging Face's cache names folders models--org--name: only flags become keywords, not parts of a path.
    path = tmp_path / "hub" / "models--meta-llama--llama-2-7b-hf" / "snapshots" / "abc"
    with pytest.raises(woq.Error) as e:
        woq.optimize_model(path, progress=False)
    assert str(path) in str(e.value)
    with pytest.raises(woq.Error, match="pass force=True to replace it"):
        (tmp_path / "exists").mkdir()
        woq.quantize(MODEL, tmp_path / "exists", progress=False)


@pytest.mark.parametrize("kwargs,flags", [
    (dict(damp_percent=0.1), ["--damp-percent", "0.1"]),
    (dict(method="squeeze"), ["--method", "squeeze"]),
    (dict(method="gptq", damp_percent=0.0), ["--method", "gptq", "--damp-percent", "0"]),
    (dict(method="gptq", calib="random:4"), ["--method", "gptq", "--calib", "random:4"]),
    (dict(method="gptq", calib="random:4x8", nsamples=2), ["--method", "gptq", "--calib", "random:4x8", "--nsamples", "2"]),
    (dict(low_bit="int3"), ["--low-bit", "int3"]),
    (dict(group_size=7), ["--group-size", "7"]),
    (dict(rounding="ggml"), ["--rounding", "ggml"]),
    (dict(gptq_format="v3"), ["--gptq-format", "v3"]),
    (dict(format="onnx"), ["--format", "onnx"]),
])
def test_quantize_bad_choices_raise_value_error_with_the_cli_message(tmp_path, kwargs, flags):
    with pytest.raises(ValueError) as e:
        woq.quantize(MODEL, tmp_path / "out", progress=False, **kwargs)
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "out"), *flags)
    assert r.returncode != 0
    # The CLI's message, its flags spelled as woq.quantize's keyword arguments.
    want = r.stderr
    for name in inspect.signature(woq.quantize).parameters:
        want = re.sub("--" + name.replace("_", "-") + r"(?![\w-])", name, want)
    assert "--" not in str(e.value)
    assert f"woq: error: {e.value}\n" == want
    assert not (tmp_path / "out").exists()


def test_quantize_file_errors_are_woq_errors(tmp_path):
    with pytest.raises(woq.Error, match="no such file or directory"):
        woq.quantize(tmp_path / "missing", tmp_path / "out", progress=False)
    (tmp_path / "exists").mkdir()
    with pytest.raises(woq.Error, match="already exists"):
        woq.quantize(MODEL, tmp_path / "exists", method="gptq", calib="random:2x32", progress=False)
    with pytest.raises(woq.Error, match="exceed the model's context"):
        woq.quantize(MODEL, tmp_path / "out", method="gptq", calib="random:2x100000", progress=False)
    with pytest.raises(ValueError, match="group_size must be an int"):
        woq.quantize(MODEL, tmp_path / "out", group_size="32", progress=False)


def without_speed(report):
    return {k: v for k, v in report.items() if k != "tokens_per_second"}


@pytest.mark.parametrize("kwargs,flags", [
    (dict(ctx=128, chunks=5), ["-c", "128", "--chunks", "5"]),
    (dict(ctx=64, batch=16, bos_per_chunk=False), ["-c", "64", "--batch", "16", "--no-bos-per-chunk"]),
    (dict(ctx=200, per_document="\n\n"), ["-c", "200", "--per-document", "\n\n"]),
])
def test_perplexity_equals_the_cli(tmp_path, model, kwargs, flags):
    report = woq.eval.perplexity(model, TEXT, progress=False, **kwargs)
    r, expected = cli_json(tmp_path, "eval", "perplexity", "-m", MODEL, "-f", TEXT, *flags)
    assert without_speed(report) == without_speed(expected)
    assert report["tokens"] > 100 and report["ppl"] > 1


def test_perplexity_of_a_text_and_its_printed_report(model, capsys):
    with open(TEXT) as f:
        text = f.read()
    a = woq.eval.perplexity(model, text, ctx=128, chunks=3, progress=False, print_report=True)
    out = capsys.readouterr().out
    assert out.startswith("model: sym_int4 (group_size 32, full range) from F32 [stories260K]\nPPL = ")
    assert f"{a['ppl']:.4f} +/- {a['ppl_stderr']:.4f} over {a['tokens']} scored tokens" in out
    import pathlib
    b = woq.eval.perplexity(model, pathlib.Path(TEXT), ctx=128, chunks=3, progress=False)
    assert without_speed(a) == without_speed(b)
    with pytest.raises(woq.Error, match="the text: .*shorter than one chunk|the text: .*tokens"):
        woq.eval.perplexity(model, "Too short.", ctx=128, progress=False)
    with pytest.raises(woq.Error, match="exceeds the model's context"):
        woq.eval.perplexity(model, text, ctx=100000, progress=False)
    with pytest.raises(ValueError, match="ctx must be > 0"):
        woq.eval.perplexity(model, text, ctx=0, progress=False)


def test_compare_equals_the_cli_with_the_weights_share(tmp_path, model, fp32):
    report = woq.eval.compare(model, fp32, TEXT, ctx=128, chunks=4, progress=False)
    r, expected = cli_json(tmp_path, "eval", "compare", "-m", MODEL, "-f", TEXT, "-c", "128", "--chunks", "4")
    assert report == expected
    assert report["mean_kl"] > 0.01 and 0.5 < report["same_top"] < 1  # sym_int4 of this model: visible, not absurd
    assert report["weights_only_mean_kl"] is not None  # int8 activations against an f32 reference


def test_compare_of_a_saved_checkpoint_with_its_original(tmp_path, fp32):
    woq.quantize(MODEL, tmp_path / "q", low_bit="asym_int4", group_size=64, progress=False)
    q = woq.optimize_model(tmp_path / "q", progress=False)
    report = woq.eval.compare(q, fp32, TEXT, ctx=96, chunks=3, progress=False)
    _, expected = cli_json(tmp_path, "eval", "compare", "-m", str(tmp_path / "q"), "--ref", MODEL, "-f", TEXT,
                           "-c", "96", "--chunks", "3")
    assert report == expected
    assert woq.eval.compare(fp32, fp32, TEXT, ctx=96, chunks=3, progress=False)["max_kl"] == 0


def swap_pieces(model_bytes, a, b):
    """A SentencePiece tokenizer.model with the entries of pieces `a` and `b` swapped (its top-level protobuf
    fields read, the two `pieces` fields, number 1, exchanged)."""
    fields, pieces, at = [], [], 0

    def varint():
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = model_bytes[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(model_bytes):
        start, tag = at, varint()
        wire = tag & 7
        if wire == 0:
            varint()
        elif wire == 2:
            length = varint()
            at += length
        else:
            at += {1: 8, 5: 4}[wire]
        if tag >> 3 == 1:
            pieces.append(len(fields))
        fields.append(model_bytes[start:at])
    fields[pieces[a]], fields[pieces[b]] = fields[pieces[b]], fields[pieces[a]]
    return b"".join(fields)


def test_compare_refuses_a_reference_with_another_tokenizer(tmp_path, model):
    """Issue 29: the same vocabulary size is not enough; ids 403 and 407 swapped are refused, naming both models
    and the first differing id (the library's check, as the CLI's)."""
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for name in os.listdir(MODEL):
        data = open(os.path.join(MODEL, name), "rb").read()
        (swapped / name).write_bytes(swap_pieces(data, 403, 407) if name == "tokenizer.model" else data)
    reference = woq.optimize_model(str(swapped), low_bit="fp32", progress=False)
    assert reference.tokenizer.token_text(403) == model.tokenizer.token_text(407)
    with pytest.raises(woq.Error, match=f"the reference {swapped} has another tokenizer than the model {MODEL}: "
                                        "token 403 is "):
        woq.eval.compare(model, reference, TEXT, ctx=128, chunks=2, progress=False)


def test_tasks_equal_the_cli(tmp_path, model):
    report = woq.eval.tasks(model, ["arc_easy", "truthfulqa_mc2", "hellaswag"], limit=12, progress=False)
    _, expected = cli_json(tmp_path, "eval", "tasks", "-m", MODEL, "--tasks", "arc_easy,truthfulqa_mc2,hellaswag",
                           "--limit", "12")
    assert list(report) == ["arc_easy", "truthfulqa_mc2", "hellaswag"]
    assert list(report.values()) == expected
    assert report["truthfulqa_mc2"]["primary_metric"] == "mc2" and report["arc_easy"]["items"] == 12
    data = os.path.join(SOURCE, "tests", "data")
    fewshot = woq.eval.tasks(model, "arc_easy=" + os.path.join(data, "arc_easy_slice.jsonl"), num_fewshot=2, seed=5,
                             progress=False)
    _, expected = cli_json(tmp_path, "eval", "tasks", "-m", MODEL, "--tasks",
                           "arc_easy=" + os.path.join(data, "arc_easy_slice.jsonl"), "--num-fewshot", "2", "--seed", "5")
    assert list(fewshot.values()) == expected and expected[0]["shots"] == 2


def test_recovery_equals_the_cli(tmp_path, model, fp32):
    asym = woq.optimize_model(MODEL, low_bit="asym_int4", progress=False)
    report = woq.eval.recovery(fp32, [model, asym], ["arc_easy", "piqa"], limit=10, ppl_text=TEXT, ctx=128,
                               progress=False)
    _, expected = cli_json(tmp_path, "eval", "recovery", "-m", MODEL, "--low-bit", "sym_int4,asym_int4", "--tasks",
                           "arc_easy,piqa", "--limit", "10", "--ppl-file", TEXT, "--ctx", "128")
    assert report == expected
    assert [v["name"] for v in report["variants"]] == ["sym_int4", "asym_int4"]
    assert report["perplexity"]["variants"][0]["recovery_percent"] < 100  # sym_int4 is worse than fp32 on it
    assert report["perplexity"]["file"] == expected["perplexity"]["file"] and report["perplexity"]["ctx"] == 128
    one = woq.eval.recovery(fp32, model, "piqa", limit=4, progress=False)
    assert one["tasks"][0]["variants"][0]["recovery_percent"] is not None and one.get("perplexity") is None
    with pytest.raises(ValueError, match="limit must be None or > 0"):
        woq.eval.recovery(fp32, model, "piqa", limit=0, progress=False)


def test_tasks_bad_arguments(model, tmp_path):
    with pytest.raises(woq.Error, match="unknown task 'arc_hard'"):
        woq.eval.tasks(model, ["arc_hard"], progress=False)
    with pytest.raises(woq.Error, match="none.jsonl"):
        woq.eval.tasks(model, ["piqa=" + str(tmp_path / "none.jsonl")], progress=False)
    with pytest.raises(woq.Error, match="piqa_validation.jsonl"):
        woq.eval.tasks(model, ["piqa"], data_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="limit must be"):
        woq.eval.tasks(model, ["piqa"], limit=0, progress=False)
    with pytest.raises(woq.Error, match="few-shot|examples"):
        woq.eval.tasks(model, ["arc_easy=" + os.path.join(SOURCE, "tests", "data", "arc_easy_slice.jsonl")],
                       num_fewshot=100000, progress=False)


def test_explain_equals_the_cli(tmp_path, model, fp32):
    e = woq.explain(fp32, model, PROMPT, max_new_tokens=40, top=6)
    out = tmp_path / "explain.json"
    r = cli("explain", "-m", MODEL, "-p", PROMPT, "-n", "40", "--top", "6", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert e.text() == r.stdout
    assert e.fields == json.loads(out.read_text())
    assert e.original_text.startswith(", there was") and len(e.layers) == 35 and len(e.kl) == 40
    assert e.diverges_at == -1 or e.original_text[:5] == e.quantized_text[:5]
    with pytest.raises(ValueError, match="two models"):
        woq.explain(model, model, PROMPT)
    with pytest.raises(ValueError, match="max_new_tokens must be > 0"):
        woq.explain(fp32, model, PROMPT, max_new_tokens=0)


class FakeTqdm:
    """tqdm's interface as woq uses it, recording what it is told."""
    bars = []

    def __init__(self, total, desc, unit, delay, leave):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        FakeTqdm.bars.append(self)

    def update(self, k):
        assert not self.closed and k >= 0
        self.n += k

    def close(self):
        self.closed = True


def test_progress_bars_use_tqdm_on_a_terminal(monkeypatch, tmp_path, fp32):
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    FakeTqdm.bars = []
    m = woq.optimize_model(MODEL, progress=True)
    woq.eval.compare(m, fp32, TEXT, ctx=128, chunks=3)
    woq.quantize(MODEL, tmp_path / "q", method="gptq", calib="random:2x32")
    woq.eval.tasks(m, ["piqa"], limit=4)
    got = [(b.desc, b.n, b.total, b.closed) for b in FakeTqdm.bars]
    assert got == [("woq: layer", 5, 5, True), ("woq: chunk", 3, 3, True), ("woq: chunk", 3, 3, True),
                   ("woq: chunk", 3, 3, True), ("woq: layer", 5, 5, True), ("woq: item", 4, 4, True)]
    FakeTqdm.bars = []
    woq.eval.perplexity(m, TEXT, ctx=128, chunks=3, progress=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    woq.eval.perplexity(m, TEXT, ctx=128, chunks=3)
    assert FakeTqdm.bars == []  # silent with progress=False, and off a terminal


def test_without_tqdm_the_engine_draws_its_line_on_a_terminal(tmp_path):
    script = ("import sys; sys.modules['tqdm'] = None\n"  # import tqdm fails
              "import woq, time\n"
              f"m = woq.optimize_model({MODEL!r}, progress=False)\n"
              f"text = open({TEXT!r}).read() * 4\n"
              "t = time.time()\n"
              "while time.time() - t < 1.5:\n"  # the line appears once the work has taken a second
              "    woq.eval.perplexity(m, text, ctx=256)\n")
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", script], stderr=follower, stdout=subprocess.DEVNULL, env=os.environ)
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    assert p.wait(timeout=120) == 0, err.decode(errors="replace")
    assert b"\rwoq: chunk " in err and b"ETA" in err


def test_ctrl_c_during_eval_raises_keyboard_interrupt_and_the_model_stays_usable(monkeypatch, model):
    calls = []

    def interrupting(progress, what):
        def bar(done, total):
            calls.append(done)
            if done == 2:
                raise KeyboardInterrupt
        return bar

    monkeypatch.setattr(woq, "_progress", interrupting)
    with pytest.raises(KeyboardInterrupt):
        woq.eval.perplexity(model, TEXT, ctx=64, chunks=10)
    with pytest.raises(KeyboardInterrupt):
        woq.eval.tasks(model, ["piqa"], limit=10)
    assert calls == [1, 2, 1, 2]
    monkeypatch.undo()
    assert woq.eval.perplexity(model, TEXT, ctx=64, chunks=3, progress=False)["tokens"] > 0
    assert model.generate(PROMPT, max_new_tokens=8)


def test_the_readme_notebook_example_runs(tmp_path):
    with open(os.path.join(SOURCE, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("### After optimize_model"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    assert "woq.explain(" in code and "woq.eval.compare(" in code and "woq.eval.tasks(" in code
    assert '"/tmp/stories-gptq-py"' in code
    code = code.replace('"/tmp/stories-gptq-py"', repr(str(tmp_path / "stories-gptq")))
    r = subprocess.run([sys.executable, "-c", code], cwd=SOURCE, capture_output=True, text=True, timeout=300,
                       env=os.environ)
    assert r.returncode == 0, r.stderr
    assert "They first differ at generated token" in r.stdout or "identical for all" in r.stdout
    assert "mean KL " in r.stdout and "recovery" in r.stdout
    gptq_kl = float(r.stdout.strip().splitlines()[-1])
    rtn_kl = float(r.stdout.split("mean KL ")[1].split()[0])
    assert 0 < gptq_kl < rtn_kl  # what the README says: GPTQ on text has the smaller error


CALIB = os.path.join(SOURCE, "tests", "data", "tinystories_calibration.txt")


def test_plan_search_writes_the_plan_the_cli_writes_and_it_loads(tmp_path):
    common = dict(calib_file=CALIB, verify_file=TEXT, nsamples=3, seqlen=64)
    woq.quantize(MODEL, tmp_path / "m.json", measure=True, calib_file=CALIB, nsamples=3, seqlen=64, progress=False)
    woq.quantize(MODEL, tmp_path / "py.json", target_kl=0.05, measurement=tmp_path / "m.json", verify_file=TEXT,
                 nsamples=3, seqlen=64, progress=False)
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "cli.json"), "--target-kl", "0.05", "--calib-file", CALIB,
            "--verify-file", TEXT, "--nsamples", "3", "--seqlen", "64")
    assert r.returncode == 0, r.stderr
    py, cl = json.loads((tmp_path / "py.json").read_text()), json.loads((tmp_path / "cli.json").read_text())
    assert py["tensors"] == cl["tensors"] and py["base"] == cl["base"] and py["verify"] == cl["verify"]
    assert 0 < py["verify"]["mean_kl"] and py["solve"]["predicted_kl"] <= py["solve"]["solved_for_kl"]
    m = woq.optimize_model(MODEL, plan=tmp_path / "py.json", progress=False)
    fp32 = woq.optimize_model(MODEL, low_bit="fp32", progress=False)
    # The plan loaded here measures what the search verified (same text, same chunks).
    got = woq.eval.compare(m, fp32, TEXT, ctx=64, chunks=3)
    assert got["mean_kl"] == pytest.approx(py["verify"]["mean_kl"], rel=1e-9)
    with pytest.raises(ValueError, match="low_bit does not apply to a plan search"):
        woq.quantize(MODEL, tmp_path / "x.json", target_kl=0.05, low_bit="sym_int4", **common)
    with pytest.raises(ValueError, match="target_kl must be positive and finite"):
        woq.quantize(MODEL, tmp_path / "x.json", target_kl=-1.0, **common)
    copy = tmp_path / "calib_copy.txt"
    copy.write_bytes(open(CALIB, "rb").read())
    with pytest.raises(woq.Error, match="holds the calibration text the measurement was taken on"):
        woq.quantize(MODEL, tmp_path / "x.json", target_kl=0.05, measurement=tmp_path / "m.json", verify_file=copy,
                     progress=False)
    with pytest.raises(ValueError, match="measurement belongs to a plan search"):
        woq.quantize(MODEL, tmp_path / "x", measurement=tmp_path / "m.json")
    # A measurement whose unplanned weights (embeddings, norms, lm_head) are not this model's is refused.
    other = json.loads((tmp_path / "m.json").read_text())
    other["other_bytes"] += 2
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(woq.Error, match="other_bytes .* a measurement of another model"):
        woq.quantize(MODEL, tmp_path / "x.json", target_kl=0.05, measurement=tmp_path / "other.json",
                     verify_file=TEXT, progress=False)


def test_the_estimate_on_fewer_rows_is_the_clis(tmp_path):
    woq.quantize(MODEL, tmp_path / "py.json", measure=True, estimate=True, estimate_rows=50, calib_file=CALIB,
                 nsamples=3, seqlen=64, progress=False)
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "cli.json"), "--measure", "--estimate", "--estimate-rows",
            "50", "--calib-file", CALIB, "--nsamples", "3", "--seqlen", "64")
    assert r.returncode == 0, r.stderr
    assert "output error on 50 rows" in r.stderr
    py, cl = json.loads((tmp_path / "py.json").read_text()), json.loads((tmp_path / "cli.json").read_text())
    assert py["error_rows"] == 50 and py["estimated"]
    py.pop("seconds"), cl.pop("seconds")
    assert py == cl
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "all.json"), "--measure", "--estimate", "--estimate-rows",
            "0", "--calib-file", CALIB, "--nsamples", "3", "--seqlen", "64")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "all.json").read_text())["error_rows"] == 3 * 64
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "x.json"), "--measure", "--estimate-rows", "50",
            "--calib-file", CALIB)
    assert r.returncode != 0 and "--estimate-rows is the rows --estimate takes output errors on" in r.stderr
    r = cli("quantize", "-m", MODEL, "-o", str(tmp_path / "x.json"), "--measure", "--estimate", "--estimate-rows",
            "-1", "--calib-file", CALIB)
    assert r.returncode != 0 and "--estimate-rows must be 0 (all) or positive" in r.stderr
    with pytest.raises(ValueError, match="estimate_rows belongs to a plan search"):
        woq.quantize(MODEL, tmp_path / "x", estimate_rows=50)


def test_a_refined_plan_says_how_many_layers_changed(tmp_path):
    # The README's GGUF plan command: its first plan misses 0.02 on the held-out text and is re-solved.
    r = cli("quantize", "-m", MODEL, "--target-kl", "0.02", "--candidates", "gguf", "--calib-file", CALIB,
            "--verify-file", TEXT, "-o", str(tmp_path / "g.json"))
    assert r.returncode == 0, r.stderr
    assert "lm_head is tied to the embeddings: neither is planned" in r.stderr
    m = re.search(r"plan 2: .*\((\d+) layers in other formats than plan 1's\)", r.stderr)
    assert m and int(m.group(1)) >= 1, r.stderr


def test_an_untied_lm_head_and_embeddings_are_planned_and_their_measurement_checked(tmp_path):
    tiny = str(tmp_path / "tiny")
    assert cli("make-random", "--preset", "tiny", "--weight-std", "0.08", "--seed", "5", "-o", tiny).returncode == 0
    m = str(tmp_path / "m.json")
    r = cli("quantize", "-m", tiny, "--measure", "--candidates", "gguf", "--calib-file", CALIB, "--nsamples", "3",
            "--seqlen", "64", "-o", m)
    assert r.returncode == 0 and "(lm_head and the embeddings among them)" in r.stderr, r.stderr
    head, embeddings = json.loads(open(m).read())["layers"][-2:]
    assert head["module"] == "lm_head" and head["candidates"][0]["held"]
    assert embeddings["module"] == "model.embed_tokens" and embeddings["candidates"][0]["held"]
    # The same model with lm_head stored as Q8_0 is not the model this measurement's "held" lm_head was.
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"woq_plan": 1, "base": {"low_bit": "fp16"},
                                "tensors": {"lm_head": {"low_bit": "sym_int8", "group_size": 32}}}))
    assert cli("quantize", "-m", tiny, "--plan", str(plan), "-o", str(tmp_path / "q8h.gguf")).returncode == 0
    r = cli("quantize", "-m", str(tmp_path / "q8h.gguf"), "--measurement", m, "--target-bpw", "16",
            "--verify-file", TEXT, "-o", str(tmp_path / "o.json"))
    assert r.returncode != 0 and "lm_head was measured as fp16" in r.stderr, r.stderr
    # A plan that quantizes lm_head names it, and what it predicts for its bytes is what loads.
    r = cli("quantize", "-m", tiny, "--measurement", m, "--target-bpw", "10", "--verify-file", TEXT, "--nsamples", "3",
            "--seqlen", "64", "-o", str(tmp_path / "small.json"))
    assert r.returncode == 0, r.stderr
    small = json.loads((tmp_path / "small.json").read_text())
    assert "lm_head" in small["tensors"] and small["solve"]["bits_per_weight"] <= 10
    assert "model.embed_tokens" in small["tensors"], small["tensors"]
    # It writes as GGUF, token_embd in its planned type, and loads.
    r = cli("quantize", "-m", tiny, "--plan", str(tmp_path / "small.json"), "-o", str(tmp_path / "small.gguf"))
    assert r.returncode == 0, r.stderr
    r = cli("generate", "-m", str(tmp_path / "small.gguf"), "-p", "Once", "-n", "4")
    assert r.returncode == 0, r.stderr
    # A measurement whose candidate bytes are not its format's for the layer's shape is refused, naming it.
    lying = json.loads(open(m).read())
    lying["layers"][-1]["candidates"][1]["bytes"] = 5
    (tmp_path / "lying.json").write_text(json.dumps(lying))
    r = cli("quantize", "-m", tiny, "--measurement", str(tmp_path / "lying.json"), "--target-bpw", "10",
            "--verify-file", TEXT, "-o", str(tmp_path / "l.json"))
    assert r.returncode != 0 and "candidates[1]: model.embed_tokens in" in r.stderr and "not 5" in r.stderr, r.stderr
    # A GPTQ checkpoint cannot hold quantized embeddings: refused, naming them.
    r = cli("quantize", "-m", tiny, "--plan", str(tmp_path / "small.json"), "-o", str(tmp_path / "gptq"))
    assert r.returncode != 0 and "model.embed_tokens: a GPTQ checkpoint keeps the embeddings in float" in r.stderr


def test_pareto_points_are_the_clis(tmp_path):
    woq.quantize(MODEL, tmp_path / "m.json", measure=True, calib_file=CALIB, nsamples=3, seqlen=64, progress=False)
    points = woq.eval.pareto(MODEL, TEXT, measurement=tmp_path / "m.json", ctx=64, chunks=3, progress=False)
    r = cli("eval", "pareto", "-m", MODEL, "-f", TEXT, "--measurement", str(tmp_path / "m.json"), "--ctx", "64",
            "--chunks", "3", "--json", str(tmp_path / "p.json"), "-o", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p.json").read_text()) == points
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kinds = {p["kind"] for p in points}
    assert kinds == {"uniform", "rule", "plan"}
    # A solved plan never predicts more KL than a uniform format of its size or less.
    for u in (p for p in points if p["kind"] == "uniform"):
        at = [p for p in points if p["kind"] == "plan" and p["bits_per_weight"] <= u["bits_per_weight"] + 1e-9]
        assert min(p["predicted_kl"] for p in at) <= u["predicted_kl"] + 1e-12


def test_a_gguf_plan_is_written_as_the_cli_writes_it_and_scores_what_was_verified(tmp_path):
    woq.quantize(MODEL, tmp_path / "g.json", target_kl=0.05, candidates="gguf", calib_file=CALIB, verify_file=TEXT,
                 nsamples=3, seqlen=64, progress=False)
    plan = json.loads((tmp_path / "g.json").read_text())
    assert plan["activations"] == "int8"
    woq.quantize(MODEL, tmp_path / "py.gguf", plan=tmp_path / "g.json", progress=False)
    r = cli("quantize", "-m", MODEL, "--plan", str(tmp_path / "g.json"), "-o", str(tmp_path / "cli.gguf"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "py.gguf").read_bytes() == (tmp_path / "cli.gguf").read_bytes()
    # The plan was verified in woq's rounding; the GGUF file loads in llama.cpp's unless told.
    got = woq.eval.compare(woq.optimize_model(tmp_path / "py.gguf", numerics="woq", progress=False),
                           woq.optimize_model(MODEL, low_bit="fp32", progress=False), TEXT, ctx=64, chunks=3)
    assert got["mean_kl"] == pytest.approx(plan["verify"]["mean_kl"], rel=1e-9)
    with pytest.raises(ValueError, match="plan does not apply to a plan search"):
        woq.quantize(MODEL, tmp_path / "x.json", target_kl=0.05, plan=tmp_path / "g.json", calib_file=CALIB,
                     verify_file=TEXT)
