"""The Python API (python/woq) against the CLI, an independent NumPy forward and woq serve.

Run by ctest (python_api) with PYTHONPATH=build/python, WOQ_BIN and WOQ_SOURCE set."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

import woq

SOURCE = os.environ["WOQ_SOURCE"]
BIN = os.environ["WOQ_BIN"]
MODEL = os.path.join(SOURCE, "assets", "models", "stories260K")
PROMPT = "Once upon a time"
sys.path.insert(0, os.path.join(SOURCE, "tests", "reference"))
sys.path.insert(0, os.path.join(SOURCE, "tools"))


def cli(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("low_bit,group_size", [("sym_int4", 32), ("asym_int4", 64), ("sym_int8", -1), ("fp32", 32)])
def test_greedy_generate_equals_the_cli_byte_for_byte(low_bit, group_size):
    m = woq.optimize_model(MODEL, low_bit=low_bit, group_size=group_size, progress=False)
    text = m.generate(PROMPT, max_new_tokens=80)
    r = cli("generate", "-m", MODEL, "-p", PROMPT, "-n", "80", "--temperature", "0", "--low-bit", low_bit,
            "--group-size", str(group_size))
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + text + "\n"
    assert m.low_bit == low_bit
    assert len(text) > 40


def test_sampling_with_a_seed_equals_the_cli(model):
    text = model.generate(PROMPT, max_new_tokens=50, temperature=0.9, top_k=20, top_p=0.9, seed=7, repeat_penalty=1.2)
    r = cli("generate", "-m", MODEL, "-p", PROMPT, "-n", "50", "--temperature", "0.9", "--top-k", "20", "--top-p",
            "0.9", "--seed", "7", "--repeat-penalty", "1.2")
    assert r.stdout == PROMPT + text + "\n"
    assert text != model.generate(PROMPT, max_new_tokens=50)  # not the greedy story: the parameters arrived


def test_stream_pieces_join_to_the_text_and_closing_early_is_clean(model):
    text = model.generate(PROMPT, max_new_tokens=60)
    pieces = list(model.generate(PROMPT, max_new_tokens=60, stream=True))
    assert len(pieces) > 10 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == text
    it = model.generate(PROMPT, max_new_tokens=400, stream=True)
    next(it)
    it.close()  # stops the worker at its next piece
    assert model.generate(PROMPT, max_new_tokens=60) == text


def test_stop_strings_and_prompt_ids(model):
    text = model.generate(PROMPT, max_new_tokens=60)
    cut = text[5:12]
    assert model.generate(PROMPT, max_new_tokens=60, stop=cut) == text[: text.index(cut)]
    assert model.generate(model.tokenizer.encode(PROMPT), max_new_tokens=60) == text


def test_tokenizer_as_the_cli(model):
    tok = model.tokenizer
    ids = tok.encode(PROMPT)
    r = cli("tokenize", "-m", MODEL, "-p", PROMPT, "--json")
    assert ids == json.loads(r.stdout)
    assert ids[0] == tok.bos_id and tok.encode(PROMPT, add_special=False) == ids[1:]
    assert tok.decode(ids) == PROMPT
    assert tok.vocab_size == model.config["vocab_size"] == 512


def test_config(model):
    # Against the model's own config.json (what the loader read), not copied constants.
    with open(os.path.join(MODEL, "config.json")) as f:
        want = json.load(f)
    c = model.config
    for key in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps"):
        assert c[key] == want[key], key
    assert model.context_limit == want["max_position_embeddings"]


def test_logits_equal_the_numpy_reference(fp32):
    if os.environ.get("WOQ_REQUIRE_REFERENCES", "") in ("", "0"):
        pytest.importorskip("numpy")
    import numpy as np  # under WOQ_REQUIRE_REFERENCES (CI) a missing NumPy fails the test
    import llama_reference
    ids = fp32.tokenizer.encode("Once upon a time, there was a little girl named Lily. She")
    got = fp32.logits(ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), 512)
    want = llama_reference.Model(MODEL, set()).logits(ids)
    assert np.abs(got - want).max() < 1e-4
    # The reference sees a different model when a feature is off: the comparison can fail.
    assert np.abs(llama_reference.Model(MODEL, {"bias", "rope_scaling"}).logits(ids[:3]) - got[:3]).max() < 1e-4
    assert np.abs(fp32.logits(ids[:5]) - got[:5]).max() == 0  # a shorter prefix: the same rows


def test_unencodable_text_and_unordered_ids_are_refused(fp32):
    # A lone surrogate has no UTF-8 form (pybind's TypeError with the signature before); a dict or a set would be
    # taken as its keys, a set in no fixed order.
    with pytest.raises(ValueError, match="prompt is not valid Unicode text"):
        fp32.generate("\ud800", max_new_tokens=1)
    with pytest.raises(ValueError, match="text is not valid Unicode text"):
        fp32.tokenizer.encode("a\udcff")
    for ids in ({1: 2, 3: 4}, {1, 2}):
        with pytest.raises(TypeError, match="prompt must be a str or a list of token ids"):
            fp32.generate(ids, max_new_tokens=1)
    with pytest.raises(TypeError, match="stop must be None, a str or a list of str"):
        fp32.generate("Once", max_new_tokens=1, stop={"a": 1})


def test_chat_template_errors_are_woq_errors(fp32):
    # A message without content makes the model's chat template fail: woq.Error naming the template.
    with pytest.raises(woq.Error, match="the chat template"):
        fp32.chat([{"role": "user"}], max_new_tokens=1)


def test_chat_replies_as_woq_serve(fp32):
    from serve_attack import Server, request
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me one."}]
    reply = fp32.chat(messages, max_new_tokens=30, temperature=0)
    assert fp32.chat_prompt(messages).startswith("<|im_start|>system\nYou tell stories.<|im_end|>")  # ChatML
    server = Server(BIN, MODEL)
    try:
        status, body = request(server.port, "POST", "/v1/chat/completions",
                               {"messages": messages, "max_tokens": 30, "temperature": 0})
    finally:
        server.stop()
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == reply
    assert "".join(fp32.chat(messages, max_new_tokens=30, temperature=0, stream=True)) == reply


def test_chat_keeps_the_conversations_kv_cache_with_a_fresh_prefills_result(fp32):
    """The second turn prefills only what the first did not hold, and replies as a cold prefill does."""
    first = [{"role": "user", "content": "Tell me a story about a dog."}]
    reply = fp32.chat(first, max_new_tokens=20, temperature=0)
    second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    ids = fp32.tokenizer.encode_with_special(fp32.chat_prompt(second))
    args = fp32._args(ids, 20, 0.0, 40, 0.95, None, None, 1.0, 64, 0.0, 0.0)
    warm = fp32._engine.generate(*args, None, True)
    assert warm["cached_tokens"] >= len(fp32.tokenizer.encode_with_special(fp32.chat_prompt(first)))
    cold = fp32._engine.generate(*args, None)
    assert cold["cached_tokens"] == 0
    assert warm["generated_ids"] == cold["generated_ids"] and warm["text"] == cold["text"]
    assert fp32.chat(second, max_new_tokens=20, temperature=0) == cold["text"]  # a whole prompt held: one token prefilled


def test_save_pretrained_loads_in_the_cli_with_the_same_greedy_output(tmp_path):
    m = woq.optimize_model(MODEL, low_bit="asym_int4", group_size=64, progress=False)
    out = tmp_path / "gptq"
    m.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["bits"] == 4 and config["quantization_config"]["group_size"] == 64
    assert config["quantization_config"]["sym"] is False
    r = cli("generate", "-m", str(out), "-p", PROMPT, "-n", "80", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + m.generate(PROMPT, max_new_tokens=80) + "\n"
    assert woq.optimize_model(str(out), progress=False).generate(PROMPT, max_new_tokens=80) == m.generate(PROMPT, max_new_tokens=80)
    with pytest.raises(woq.Error, match="already exists"):
        m.save_pretrained(out)
    m.save_pretrained(out, force=True)
    with pytest.raises(ValueError, match="already quantized"):
        woq.optimize_model(str(out), progress=False).save_pretrained(tmp_path / "again")
    with pytest.raises(ValueError, match="integer formats"):
        woq.optimize_model(MODEL, low_bit="fp16", progress=False).save_pretrained(tmp_path / "f16")


def test_save_pretrained_writes_the_plan_it_was_loaded_with(tmp_path):
    # An untied model: the plan's lm_head is written as GPTQ integers ("lm_head": true and its rule), and the
    # checkpoint runs as the plan did in memory.
    tiny = str(tmp_path / "tiny")
    assert cli("make-random", "--preset", "tiny", "--weight-std", "0.08", "--seed", "3", "-o", tiny).returncode == 0
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"woq_plan": 1, "base": {"low_bit": "sym_int4", "group_size": 32},
                                "tensors": {"lm_head": {"low_bit": "sym_int8", "group_size": -1},
                                            "model.layers.1.mlp.down_proj": {"low_bit": "fp16"}}}))
    m = woq.optimize_model(tiny, plan=str(plan), progress=False)
    out = tmp_path / "gptq"
    m.save_pretrained(out)
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["lm_head"] is True and q["dynamic"]["+:lm_head$"] == {"bits": 8, "group_size": -1}, q
    assert "-:model\\.layers\\.1\\.mlp\\.down_proj$" in q["dynamic"], q
    back = woq.optimize_model(str(out), progress=False)
    assert back.generate(PROMPT, max_new_tokens=40) == m.generate(PROMPT, max_new_tokens=40)
    # lm_head converted without a plan, or embeddings a GPTQ checkpoint cannot hold: refused.
    with pytest.raises(ValueError, match="lm_head_low_bit: save_pretrained writes lm_head as a plan names it"):
        woq.optimize_model(tiny, lm_head_low_bit="sym_int8", progress=False).save_pretrained(tmp_path / "h")
    plan.write_text(json.dumps({"woq_plan": 1, "base": {"low_bit": "sym_int4", "group_size": 32},
                                "tensors": {"model.embed_tokens": {"low_bit": "sym_int8", "group_size": -1}}}))
    with pytest.raises(woq.Error, match="model.embed_tokens: a GPTQ checkpoint keeps the embeddings in float"):
        woq.optimize_model(tiny, plan=str(plan), progress=False).save_pretrained(tmp_path / "e")


def test_bad_arguments_raise_clear_exceptions(model):
    missing = "/nonexistent/model"
    with pytest.raises(woq.Error) as e:
        woq.optimize_model(missing, progress=False)
    assert "woq: error: " + str(e.value) + "\n" in cli("generate", "-m", missing, "-p", "x").stderr
    assert isinstance(e.value, RuntimeError)
    for kwargs, message in [({"low_bit": "int3"}, "unknown low-bit type 'int3'"),
                            ({"group_size": 0}, "group_size 0 is invalid"),
                            ({"int4_range": "half"}, "unknown int4 range"),
                            ({"activations": "int4"}, "int4"), ({"activations": ""}, "activations must be None"),
                            ({"threads": -1}, "threads must be >= 0")]:
        with pytest.raises(ValueError, match=message):
            woq.optimize_model(MODEL, progress=False, **kwargs)
    for kwargs, message in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p must be in"),
                            ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"), ({"stop": [""]}, "must not be empty"),
                            ({"seed": -3}, "seed must be None or an int"), ({"repeat_penalty": 0}, "repeat")]:
        with pytest.raises(ValueError, match=message):
            model.generate(PROMPT, **kwargs)
    with pytest.raises(ValueError, match="ids is empty"):
        model.logits([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.logits([1, 512])
    with pytest.raises(ValueError, match="exceed the model's context"):
        model.logits([1] * 513)
    with pytest.raises(ValueError, match="token ids must be ints"):
        model.logits([1, "a"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.tokenizer.decode([-1])
    with pytest.raises(ValueError, match="messages must be a list"):
        model.chat("hello")


def test_arguments_of_the_wrong_type_or_beyond_range_name_the_argument(model, fp32, tmp_path, monkeypatch):
    """Issue 29: no argument is converted behind the user's back (None to "None", bytes to ids, 3.5 to 3); a wrong
    type is a TypeError (woq.ArgumentTypeError, also a ValueError), an int the engine cannot hold a ValueError,
    both naming the argument (not pybind's TypeError listing the whole signature)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="out_dir must be a str or an os.PathLike, got NoneType"):
        woq.optimize_model(MODEL, low_bit="asym_int4", progress=False).save_pretrained(None)
    assert not (tmp_path / "None").exists()
    with pytest.raises(TypeError, match="path must be a str or an os.PathLike, got NoneType"):
        woq.optimize_model(None, progress=False)
    with pytest.raises(TypeError, match="prompt must be a str or a list of token ids"):
        model.generate(b"Once")
    assert model.generate(PROMPT, max_new_tokens=5) == model.generate(model.tokenizer.encode(PROMPT), max_new_tokens=5)
    huge = 2 ** 70
    calls = {  # name -> a call with that argument set to `v`
        "max_new_tokens": lambda v: model.generate(PROMPT, max_new_tokens=v),
        "top_k": lambda v: model.generate(PROMPT, top_k=v),
        "repeat_last_n": lambda v: model.generate(PROMPT, repeat_last_n=v),
        "seed": lambda v: model.generate(PROMPT, temperature=0.5, seed=v),
        "group_size": lambda v: woq.optimize_model(MODEL, group_size=v, progress=False),
        "threads": lambda v: woq.optimize_model(MODEL, threads=v, progress=False),
        "top": lambda v: woq.explain(fp32, model, PROMPT, top=v),
        "ctx": lambda v: woq.eval.perplexity(model, "x " * 300, ctx=v, progress=False),
        "batch": lambda v: woq.eval.perplexity(model, "x " * 300, batch=v, progress=False),
        "chunks": lambda v: woq.eval.compare(model, fp32, "x " * 300, chunks=v, progress=False),
        "limit": lambda v: woq.eval.tasks(model, "arc_easy", limit=v, progress=False),
        "num_fewshot": lambda v: woq.eval.tasks(model, "arc_easy", num_fewshot=v, progress=False),
        "nsamples": lambda v: woq.quantize(MODEL, tmp_path / "q", method="gptq", nsamples=v, progress=False),
        "block_size": lambda v: woq.quantize(MODEL, tmp_path / "q", method="gptq", block_size=v, progress=False),
        "id": lambda v: model.tokenizer.token_text(v),
    }
    for name, call in calls.items():
        for bad in (3.5, "3", True):
            with pytest.raises(TypeError, match=f"^{name} must be (None or )?an int, got "):
                call(bad)
        with pytest.raises(ValueError, match=f"^{name} must be (None or )?an int in \\[") as e:
            call(huge)
        assert not isinstance(e.value, TypeError)
    strings = {
        "low_bit": lambda v: woq.optimize_model(MODEL, low_bit=v, progress=False),
        "rounding": lambda v: woq.optimize_model(MODEL, rounding=v, progress=False),
        "activations": lambda v: woq.optimize_model(MODEL, activations=v, progress=False),
        "prompt": lambda v: woq.explain(fp32, model, v),
        "text": lambda v: model.tokenizer.encode(v),
        "stop": lambda v: model.generate(PROMPT, stop=[v]),
        "calib": lambda v: woq.quantize(MODEL, tmp_path / "q", method="gptq", calib=v, progress=False),
        "input": lambda v: woq.quantize(v, tmp_path / "q", progress=False),
        "output": lambda v: woq.quantize(MODEL, v, progress=False),
        "tasks": lambda v: woq.eval.tasks(model, [v], progress=False),
    }
    for name, call in strings.items():
        with pytest.raises(TypeError, match=f"^{name} must be "):
            call(b"x")
    with pytest.raises(TypeError, match="force must be True or False"):
        woq.quantize(MODEL, tmp_path / "q", force="no", progress=False)
    with pytest.raises(TypeError, match="text_or_path must be a str or a path"):
        woq.eval.perplexity(model, b"x " * 300, progress=False)
    assert not os.listdir(tmp_path)


def test_two_threads_on_two_models_at_once(model, fp32):
    want = {id(m): m.generate(PROMPT, max_new_tokens=120) for m in (model, fp32)}
    got = {}

    def run(m):
        got[id(m)] = [m.generate(PROMPT, max_new_tokens=120) for _ in range(3)]

    threads = [threading.Thread(target=run, args=(m,)) for m in (model, fp32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in (model, fp32):
        assert got[id(m)] == [want[id(m)]] * 3
    assert want[id(model)] != want[id(fp32)]


def test_ctrl_c_raises_keyboard_interrupt_and_the_model_stays_usable(model):
    text = model.generate(PROMPT, max_new_tokens=60)
    # SIGINT while a piece is being handed over (the engine's check between tokens).
    engine_args = model._args(PROMPT, 400, 0.0, 40, 0.95, None, None, 1.0, 64, 0.0, 0.0)
    with pytest.raises(KeyboardInterrupt):
        model._engine.generate(*engine_args, lambda piece: signal.raise_signal(signal.SIGINT))
    assert model.generate(PROMPT, max_new_tokens=60) == text
    # SIGINT from another thread while generation runs with the GIL released.
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in range(10000):
            model.generate(PROMPT, max_new_tokens=500)
    timer.join()
    assert model.generate(PROMPT, max_new_tokens=60) == text
