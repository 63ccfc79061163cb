#!/usr/bin/env python3
"""Independent float64 reference for woq's perplexity tests: a NumPy forward
pass of a Llama-family checkpoint (HF conventions: RMSNorm, rotate-half RoPE,
GQA, SwiGLU; single model.safetensors, F32/F16 weights) that prints, as JSON,
the negative log-likelihood of every scored token of the sequences it is given.

usage: llama_nll.py MODEL_DIR PLAN_JSON   (PLAN_JSON: {"sequences": [[ids...]], "first_scored": N})
Exit 77 when NumPy is missing (the test then skips)."""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(77)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = {"F32": np.float32, "F16": np.float16}[t["dtype"]]
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(t["shape"]).astype(np.float64)
    return out


def main():
    model_dir, plan_path = sys.argv[1], sys.argv[2]
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = load_safetensors(f"{model_dir}/model.safetensors")
    plan = json.load(open(plan_path))
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", hidden // heads)
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    embed = w["model.embed_tokens.weight"]
    head = w.get("lm_head.weight", embed)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)

    def rope(x, t):  # x: [t, h, d], rotate-half convention
        ang = np.arange(t)[:, None] * inv_freq[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        half = head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    nll = []
    for seq in plan["sequences"]:
        t = len(seq)
        x = embed[np.array(seq)]
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, head_dim)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, head_dim)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, head_dim)
            q, k = rope(q, t), rope(k, t)
            rep = heads // kv_heads
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
            scores = scores + np.triu(np.full((t, t), -np.inf), 1)[None]
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", scores, v).reshape(t, heads * head_dim)
            x = x + att @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
        logits = rms(x, w["model.norm.weight"]) @ head.T
        m = logits.max(-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        for j in range(plan["first_scored"], t - 1):
            nll.append(float(logz[j] - logits[j, seq[j + 1]]))
    json.dump({"nll": nll}, sys.stdout)


if __name__ == "__main__":
    main()
