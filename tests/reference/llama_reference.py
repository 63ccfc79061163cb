#!/usr/bin/env python3
"""Independent float64 reference for woq's model tests: a NumPy forward pass of
a Llama-family checkpoint in Hugging Face conventions (RMSNorm, rotate-half
RoPE with linear / llama3 scaling, GQA, SwiGLU; Qwen2 q/k/v biases, Llama /
Qwen3 attention_bias, Qwen3 q/k norms, Mistral / Qwen2 sliding windows; tied
or untied embeddings; F32/F16/BF16, single or sharded safetensors), written
from transformers' modeling_{llama,mistral,qwen2,qwen3}.py and
modeling_rope_utils.py, not from woq's code.

usage: llama_reference.py MODEL_DIR PLAN_JSON
PLAN_JSON: {"sequences": [[ids...]], "first_scored": N,
            "greedy": {"prompt": [ids...], "n": K}          (optional)
            "disable": ["bias", "qk_norm", "rope_scaling", "sliding_window"]  (optional)}
Prints {"nll": [...], "greedy": [...]} as JSON: the negative log-likelihood of
every scored token of the sequences (tokens first_scored + 1 ...), and the K
greedy continuation tokens of the prompt. "disable" drops features, so a test
can show that each one changes the output.
Exit 77 when NumPy is missing (the test then skips)."""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(77)


def load_safetensors(path, out):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        raw = data[begin:end]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype={"F32": np.float32, "F16": np.float16}[t["dtype"]])
        out[name] = a.reshape(t["shape"]).astype(np.float64)


def load_weights(model_dir):
    w = {}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            load_safetensors(os.path.join(model_dir, shard), w)
    else:
        load_safetensors(os.path.join(model_dir, "model.safetensors"), w)
    return w


def inv_frequencies(cfg, head_dim, use_scaling):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if not use_scaling or kind == "default":
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":  # _compute_llama3_parameters
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled)
    raise SystemExit(f"unsupported rope_scaling {kind}")


def layer_windows(cfg, arch, layers, use_window):
    """Per layer: the sliding window (keys j with i - j < window), or None."""
    if not use_window:
        return [None] * layers
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM") and cfg.get("sliding_window"):
        return [cfg["sliding_window"]] * layers
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        first = cfg.get("max_window_layers", 28)
        return [cfg["sliding_window"] if l >= first else None for l in range(layers)]
    return [None] * layers


class Model:
    def __init__(self, model_dir, disable):
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.w = load_weights(model_dir)
        self.arch = cfg.get("architectures", ["LlamaForCausalLM"])[0]
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.layers = cfg["num_hidden_layers"]
        self.inv_freq = inv_frequencies(cfg, self.head_dim, "rope_scaling" not in disable)
        self.windows = layer_windows(cfg, self.arch, self.layers, "sliding_window" not in disable)
        self.use_bias = "bias" not in disable
        self.use_qk_norm = "qk_norm" not in disable and self.arch == "Qwen3ForCausalLM"
        self.embed = self.w["model.embed_tokens.weight"]
        self.head = self.w.get("lm_head.weight", self.embed)

    def rms(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x):  # x: [t, h, d], rotate-half convention
        ang = np.arange(x.shape[0])[:, None] * self.inv_freq[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        half = self.head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def linear(self, name, x):
        y = x @ self.w[name + ".weight"].T
        if self.use_bias and name + ".bias" in self.w:
            y = y + self.w[name + ".bias"]
        return y

    def logits(self, seq, last_only=False):
        t = len(seq)
        x = self.embed[np.array(seq)]
        i, j = np.arange(t)[:, None], np.arange(t)[None, :]
        for l in range(self.layers):
            p = f"model.layers.{l}."
            h = self.rms(x, self.w[p + "input_layernorm.weight"])
            if self.arch == "Phi3ForCausalLM":  # Phi3Attention: qkv_proj, then q, k, v by columns
                qkv = self.linear(p + "self_attn.qkv_proj", h)
                nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
                q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
            else:
                q = self.linear(p + "self_attn.q_proj", h)
                k = self.linear(p + "self_attn.k_proj", h)
                v = self.linear(p + "self_attn.v_proj", h)
            q = q.reshape(t, self.heads, self.head_dim)
            k = k.reshape(t, self.kv_heads, self.head_dim)
            v = v.reshape(t, self.kv_heads, self.head_dim)
            if self.use_qk_norm:
                q = self.rms(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q), self.rope(k)
            rep = self.heads // self.kv_heads
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.head_dim)
            allowed = j <= i
            if self.windows[l] is not None:
                allowed &= (i - j) < self.windows[l]
            scores = np.where(allowed[None], scores, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", scores, v).reshape(t, self.heads * self.head_dim)
            x = x + self.linear(p + "self_attn.o_proj", att)
            h = self.rms(x, self.w[p + "post_attention_layernorm.weight"])
            if self.arch == "Phi3ForCausalLM":  # Phi3MLP: gate_up_proj, then chunk(2): gate, up
                g, u = np.split(self.linear(p + "mlp.gate_up_proj", h), 2, axis=-1)
            else:
                g = self.linear(p + "mlp.gate_proj", h)
                u = self.linear(p + "mlp.up_proj", h)
            x = x + self.linear(p + "mlp.down_proj", g / (1 + np.exp(-g)) * u)
        if last_only:
            x = x[-1:]
        return self.rms(x, self.w["model.norm.weight"]) @ self.head.T


def main():
    model_dir, plan_path = sys.argv[1], sys.argv[2]
    plan = json.load(open(plan_path))
    m = Model(model_dir, set(plan.get("disable", [])))
    nll = []
    for seq in plan.get("sequences", []):
        logits = m.logits(seq)
        top = logits.max(-1, keepdims=True)
        logz = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
        for j in range(plan["first_scored"], len(seq) - 1):
            nll.append(float(logz[j] - logits[j, seq[j + 1]]))
    greedy = []
    if "greedy" in plan:
        ids = list(plan["greedy"]["prompt"])
        for _ in range(plan["greedy"]["n"]):
            ids.append(int(np.argmax(m.logits(ids, last_only=True)[-1])))
        greedy = ids[len(plan["greedy"]["prompt"]):]
    json.dump({"nll": nll, "greedy": greedy}, sys.stdout)


if __name__ == "__main__":
    main()
