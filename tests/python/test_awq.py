"""AWQ checkpoints (AutoAWQ's GEMM and GEMV layouts) written by an independent NumPy packer
(tests/reference/awq_pack.py) load in woq as their exactly dequantized float twins.

Run by ctest (python_api) with PYTHONPATH=build/python, WOQ_BIN and WOQ_SOURCE set."""
import os
import subprocess
import sys

import numpy as np
import pytest

import woq

SOURCE = os.environ["WOQ_SOURCE"]
BIN = os.environ["WOQ_BIN"]
MODEL = os.path.join(SOURCE, "assets", "models", "stories260K")
TEXT = os.path.join(SOURCE, "tests", "data", "tinystories_heldout.txt")
sys.path.insert(0, os.path.join(SOURCE, "tests", "reference"))
import awq_pack  # noqa: E402

IDS = [1, 403, 407, 261, 378, 80, 65, 11, 300]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One decoder block of the `small` preset (hidden 1024, intermediate 2816): every linear fits AWQ's shapes."""
    out = str(tmp_path_factory.mktemp("small") / "model")
    subprocess.run([BIN, "make-random", "--preset", "small", "--layers", "1", "--seed", "3", "-o", out], check=True,
                   capture_output=True, timeout=300)
    return out


def mean_kl(p_logits, q_logits):
    """Mean over positions of KL(softmax p || softmax q), in nats."""
    def log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def text_ids(model, n=128):
    return model.tokenizer.encode(open(TEXT).read())[:n]


# stories260K's MLP (intermediate 172) fits no AWQ packing (N % 8, K % group): it stays float, as AutoAWQ's
# modules_to_not_convert keeps such modules; its attention is real trained weights.
CASES = [("stories", "gemm", 32), ("stories", "gemm", 64), ("stories", "gemv", 32), ("stories", "gemv", 64),
         ("small", "gemm", 128), ("small", "gemv", 128)]


@pytest.mark.parametrize("model_name,version,group", CASES)
def test_awq_checkpoint_is_its_dequantized_twin(tmp_path, small, model_name, version, group):
    src = MODEL if model_name == "stories" else small
    awq, twin = str(tmp_path / "awq"), str(tmp_path / "twin")
    awq_pack.write(src, awq, twin, version, group, ["mlp"] if model_name == "stories" else [])
    a = woq.optimize_model(awq, activations="f32", progress=False)
    assert a.label.startswith(f"AWQ {version.upper()} 4-bit asym group_size {group}")
    t = woq.optimize_model(twin, low_bit="fp32", progress=False)
    ids = text_ids(t)
    np.testing.assert_allclose(a.logits(ids), t.logits(ids), rtol=0, atol=1e-4)
    greedy = dict(max_new_tokens=48, temperature=0.0)
    assert a.generate("Once upon a time", **greedy) == t.generate("Once upon a time", **greedy)
    # int8 activations (each group's inputs as Q8 blocks): close to the twin's float product.
    int8 = woq.optimize_model(awq, activations="int8", progress=False)
    assert mean_kl(t.logits(ids), int8.logits(ids)) <= 0.003


def test_awq_interleave_order_matters(tmp_path):
    """GEMM packed without AWQ's nibble order (0, 2, 4, 6, 1, 3, 5, 7) reads as another model: the test above
    would catch a reader with the wrong order."""
    awq, twin = str(tmp_path / "awq"), str(tmp_path / "twin")
    awq_pack.write(MODEL, awq, twin, "gemm", 32, ["mlp"], order=awq_pack.SEQUENTIAL)
    a = woq.optimize_model(awq, activations="f32", progress=False)
    t = woq.optimize_model(twin, low_bit="fp32", progress=False)
    ids = text_ids(t)
    assert mean_kl(t.logits(ids), a.logits(ids)) > 0.1


def test_bad_awq_checkpoints_name_the_field_or_tensor(tmp_path):
    import json
    awq, twin = str(tmp_path / "awq"), str(tmp_path / "twin")
    awq_pack.write(MODEL, awq, twin, "gemm", 32, ["mlp"])
    config_path = os.path.join(awq, "config.json")
    good = json.load(open(config_path))

    def error_with(**fields):
        c = json.loads(json.dumps(good))
        c["quantization_config"].update(fields)
        json.dump(c, open(config_path, "w"))
        with pytest.raises(woq.Error) as e:
            woq.optimize_model(awq, progress=False)
        return str(e.value)

    assert "'bits' is 8: AWQ checkpoints hold 4-bit weights" in error_with(bits=8)
    assert "'version' is 'gemv_fast'" in error_with(version="gemv_fast")
    assert "'version' is 'marlin'" in error_with(version="marlin")
    assert "'version' is 'exllama9'" in error_with(version="exllama9")
    assert "'zero_point' is false" in error_with(zero_point=False)
    assert "'lm_head' is true: AutoAWQ keeps lm_head in float" in error_with(lm_head=True)
    assert "lm_head" in error_with(lm_head="yes")  # not a boolean
    # group_size 64 against tensors of group 32: the tensor and the expected shape are named.
    e = error_with(group_size=64)
    assert "model.layers.0.self_attn.q_proj.qzeros' has shape [2, 8], expected [1, 8]" in e, e
    # GEMM tensors labelled GEMV: qweight [K, N/8] and [N, K/8] agree for a square layer, qzeros do not.
    e = error_with(version="gemv")
    assert "model.layers.0.self_attn.q_proj.qzeros' has shape [2, 8], expected [64, 4] (AWQ GEMV" in e, e
    # modules_to_not_convert naming a module whose integers are there.
    assert "keeps 'model.layers.0.self_attn.q_proj' unquantized" in error_with(modules_to_not_convert=["mlp", "q_proj"])


def read_safetensors(path):
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F16": np.float16, "I32": np.int32}
    return {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=dtypes[t["dtype"]])
            .reshape(t["shape"]).copy() for name, t in header.items() if name != "__metadata__"}


def test_missing_qzeros_and_nan_scales_name_the_tensor(tmp_path):
    awq, twin = str(tmp_path / "awq"), str(tmp_path / "twin")
    awq_pack.write(MODEL, awq, twin, "gemv", 32, ["mlp"])
    path = os.path.join(awq, "model.safetensors")
    tensors = read_safetensors(path)

    def error_with(edit):
        t = dict(tensors)
        edit(t)
        awq_pack.write_safetensors(path, t)
        with pytest.raises(woq.Error) as e:
            woq.optimize_model(awq, progress=False)
        return str(e.value)

    e = error_with(lambda t: t.pop("model.layers.2.self_attn.k_proj.qzeros"))
    assert "model.layers.2.self_attn.k_proj.qzeros" in e, e

    def nan_scale(t):
        s = t["model.layers.1.self_attn.v_proj.scales"].copy()
        s[3, 1] = np.nan
        t["model.layers.1.self_attn.v_proj.scales"] = s
    e = error_with(nan_scale)
    assert "'model.layers.1.self_attn.v_proj.scales' holds nan" in e, e


def test_woq_awq_output_reads_as_awq_in_numpy(tmp_path, small):
    """woq quantize --format awq, read by the independent NumPy unpacker: its float twin gives woq's logits."""
    import json
    out = str(tmp_path / "awq")
    woq.quantize(small, out, format="awq", group_size=64, progress=False)
    q = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    assert (q["quant_method"], q["bits"], q["group_size"], q["zero_point"], q["version"]) == ("awq", 4, 64, True, "gemm")
    tensors = read_safetensors(os.path.join(out, "model.safetensors"))
    twin = {}
    for name in list(tensors):
        if name.endswith(".qweight"):
            prefix = name[:-len(".qweight")]
            twin[prefix + ".weight"] = awq_pack.dequantize(tensors, prefix, "gemm", 64)
        elif not name.endswith(".qzeros") and not name.endswith(".scales"):
            twin[name] = tensors[name].astype(np.float32)
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    for f in os.listdir(small):
        if f.endswith(".json") or f.endswith(".model"):
            with open(os.path.join(small, f), "rb") as src, open(twin_dir / f, "wb") as dst:
                dst.write(src.read())
    awq_pack.write_safetensors(str(twin_dir / "model.safetensors"), twin)
    a = woq.optimize_model(out, activations="f32", progress=False)
    t = woq.optimize_model(str(twin_dir), low_bit="fp32", progress=False)
    np.testing.assert_allclose(a.logits(IDS), t.logits(IDS), rtol=0, atol=1e-4)


def test_method_awq_writes_what_the_cli_writes(tmp_path):
    """woq.quantize(method="awq") is the CLI's --method awq: the same files, byte for byte (the same OpenBLAS
    kernels chosen by both: python/woq/__init__.py's _choose_blas_kernels)."""
    calib = os.path.join(SOURCE, "tests", "data", "tinystories_calibration.txt")
    py, cli = str(tmp_path / "py"), str(tmp_path / "cli")
    woq.quantize(MODEL, py, method="awq", low_bit="asym_int4", group_size=32, calib_file=calib, nsamples=4, seqlen=64,
                 awq_grid=10, awq_search_tokens=128, awq_propagate="quantized", progress=False)
    r = subprocess.run([BIN, "quantize", "-m", MODEL, "-o", cli, "--method", "awq", "--low-bit", "asym_int4",
                        "--group-size", "32", "--calib-file", calib, "--nsamples", "4", "--seqlen", "64",
                        "--awq-grid", "10", "--awq-search-tokens", "128", "--awq-propagate", "quantized"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "layer 5/5 AWQ:" in r.stderr and "q/k/v a=" in r.stderr
    for f in ("model.safetensors", "config.json"):
        assert open(os.path.join(py, f), "rb").read() == open(os.path.join(cli, f), "rb").read(), f
    with pytest.raises(ValueError, match="awq_grid applies to method awq"):
        woq.quantize(MODEL, str(tmp_path / "x"), awq_grid=10, progress=False)
    with pytest.raises(ValueError, match="awq_search_tokens applies to method awq"):
        woq.quantize(MODEL, str(tmp_path / "x"), awq_search_tokens=64, progress=False)
    with pytest.raises(ValueError, match="awq_propagate must be quantized or float"):
        woq.quantize(MODEL, str(tmp_path / "x"), method="awq", awq_propagate="fp32", progress=False)
    for keyword in ("awq_propagate", "awq_search_tokens"):  # the CLI refuses them in a plan search too
        with pytest.raises(ValueError, match=f"{keyword} does not apply to a plan search"):
            woq.quantize(MODEL, str(tmp_path / "m.json"), measure=True, calib_file=calib, progress=False,
                         **{keyword: "float" if keyword == "awq_propagate" else 64})


def reference_awq_layer(calib_ids, grid, qkv_seqs=None, row_step=1, layer=0):
    """AWQ's scale search for the q/k/v and gate/up groups of stories260K's block `layer` in float64 NumPy, from
    the independent reference model (tests/reference/llama_reference.py) and the asym_int4 g32 rule of
    src/formats/asym_int4.h: per group [best ratio, scales, loss per ratio]. The block's inputs are the float
    model's (the blocks before it unquantized: AutoAWQ's order, woq's default --awq-propagate float). The q/k/v
    loss is taken on the sequences qkv_seqs (None: all), the gate/up loss on every row_step-th row of all
    sequences' rows."""
    from llama_reference import Model
    m = Model(MODEL, set())
    linears = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
    w = {}

    def fake_quant(x):  # asym_int4 g32: lo/hi include 0, fp16 scale, round half to even
        g = x.reshape(x.shape[0], -1, 32)
        lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
        s = ((hi - lo) / 15).astype(np.float32).astype(np.float16).astype(np.float64)
        z = np.clip(np.round(-lo / s), 0, 15)
        q = np.clip(np.round(g / s[..., None]) + z[..., None], 0, 15)
        return ((q - z[..., None]) * s[..., None]).reshape(x.shape)

    def attention_out(h, wq, wk, wv):
        t = h.shape[0]
        q = (h @ wq.T).reshape(t, m.heads, m.head_dim)
        k = (h @ wk.T).reshape(t, m.kv_heads, m.head_dim)
        v = (h @ wv.T).reshape(t, m.kv_heads, m.head_dim)
        q, k = m.rope(q), m.rope(k)
        rep = m.heads // m.kv_heads
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(m.head_dim)
        scores = np.where((np.arange(t)[None, :] <= np.arange(t)[:, None])[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        return np.einsum("hqk,khd->qhd", scores, v).reshape(t, -1) @ w["self_attn.o_proj"].T

    def mlp(h, gate, up):
        g, u = h @ gate.T, h @ up.T
        return (g / (1 + np.exp(-g)) * u) @ w["mlp.down_proj"].T

    hs, o_out, h2s, mlp_out = [], [], [], []
    for seq in calib_ids:
        x = m.embed[np.array(seq)]
        for lay in range(layer + 1):
            p = f"model.layers.{lay}."
            w.update({r: m.w[p + r + ".weight"] for r in linears})
            h = m.rms(x, m.w[p + "input_layernorm.weight"])
            o = attention_out(h, w["self_attn.q_proj"], w["self_attn.k_proj"], w["self_attn.v_proj"])
            h2 = m.rms(x + o, m.w[p + "post_attention_layernorm.weight"])
            y = mlp(h2, w["mlp.gate_proj"], w["mlp.up_proj"])
            x = x + o + y
        hs.append(h), o_out.append(o), h2s.append(h2), mlp_out.append(y)

    def search(x, weights, loss):
        x_mean = np.abs(np.concatenate(x)).mean(0)
        cat = np.concatenate(weights).reshape(-1, 32)
        w_mean = (np.abs(cat) / (np.abs(cat).max(-1, keepdims=True) + 1e-6)).reshape(-1, x_mean.size).mean(0)
        unscaled = loss(list(weights) and [fake_quant(wi) for wi in weights])
        losses, all_scales = [], []
        for i in range(grid):
            a = i / grid
            s = np.maximum(x_mean ** a / (w_mean ** (1 - a) + 1e-4), 1e-4)
            s = s / np.sqrt(s.max() * s.min())
            losses.append(loss([fake_quant(wi * s) / s for wi in weights]))
            all_scales.append(s)
        best = int(np.argmin(losses))
        if unscaled <= losses[best]:  # woq keeps s = 1 when no grid point beats it
            return None, np.ones_like(x_mean), losses + [unscaled]
        return best / grid, all_scales[best], losses + [unscaled]

    seqs = range(len(hs)) if qkv_seqs is None else qkv_seqs
    qkv = search(hs, [w["self_attn.q_proj"], w["self_attn.k_proj"], w["self_attn.v_proj"]],
                 lambda c: np.mean([(attention_out(hs[i], *c) - o_out[i]) ** 2 for i in seqs]))
    rows, ys = np.concatenate(h2s)[::row_step], np.concatenate(mlp_out)[::row_step]
    gate_up = search(h2s, [w["mlp.gate_proj"], w["mlp.up_proj"]], lambda c: np.mean((mlp(rows, *c) - ys) ** 2))
    return {"q/k/v": qkv, "gate/up": gate_up}


@pytest.mark.parametrize("search_tokens,qkv_seqs,row_step,layer", [(None, None, 1, 0), ("128", [0, 2], 2, 0),
                                                                   (None, None, 1, 1)])
def test_awq_scale_search_matches_a_float64_reference(tmp_path, search_tokens, qkv_seqs, row_step, layer):
    """A block's q/k/v and gate/up scales: the exponent woq chose (its log; "none": s = 1 beat the grid) is the
    float64 reference's (or ties with it within 1e-3 of the least loss), and the scales it folded into the RMSNorm
    weights (original / folded) are the reference's for that exponent. 4 x 64 calibration tokens, all of them in
    the losses (the default --awq-search-tokens 512), or 128 of them: sequences 0 and 2 for q/k/v, every second
    row for gate/up. Layer 0, and layer 1 (its inputs the float model's, as the reference's; with
    --awq-propagate quantized, the quantized layer 0's outputs, its choices differ)."""
    import re
    calib = os.path.join(SOURCE, "tests", "data", "tinystories_calibration.txt")
    out = str(tmp_path / "awq")
    r = subprocess.run([BIN, "quantize", "-m", MODEL, "-o", out, "--method", "awq", "--low-bit", "asym_int4",
                        "--group-size", "32", "--calib-file", calib, "--nsamples", "4", "--seqlen", "64", "--no-clip"]
                       + (["--awq-search-tokens", search_tokens] if search_tokens else []),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = [t for t in r.stderr.splitlines() if f"layer {layer + 1}/5 AWQ:" in t][0]
    chosen = {g: None if a == "none" else float(a) for g, a in re.findall(r"(q/k/v|gate/up) a=([0-9.]+|none)", line)}
    ids = woq.optimize_model(MODEL, progress=False).tokenizer.encode(open(calib).read())
    ref = reference_awq_layer([ids[i * 64:(i + 1) * 64] for i in range(4)], 20, qkv_seqs, row_step, layer)
    original = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    folded = read_safetensors(os.path.join(out, "model.safetensors"))
    for group, norm in (("q/k/v", "input_layernorm"), ("gate/up", "post_attention_layernorm")):
        ratio, scales, losses = ref[group]
        at_woq = losses[-1] if chosen[group] is None else losses[int(round(chosen[group] * 20))]
        assert chosen[group] == ratio or at_woq <= min(losses) * (1 + 1e-3), (group, chosen[group], ratio, losses)
        if chosen[group] == ratio:  # the folded scales are the reference's for that exponent
            name = f"model.layers.{layer}.{norm}.weight"
            np.testing.assert_allclose(original[name].astype(np.float64) / folded[name], scales, rtol=1e-5)
