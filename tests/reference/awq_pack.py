#!/usr/bin/env python3
"""An independent AWQ packer (NumPy), written from AutoAWQ's documented layouts, for woq's tests.

From a float Hugging Face checkpoint it writes
  OUT:  an AWQ checkpoint as AutoAWQ saves it (quantization_config quant_method "awq", bits 4, group_size,
        zero_point true, version "gemm" or "gemv", modules_to_not_convert), its block linears quantized by
        AutoAWQ's zero-point round to nearest (scale = (max - min) / 15 in fp16, zero = -round(min / scale));
  TWIN: the same model in float32 with every quantized weight replaced by (q - zero) * scale, exactly.

Layouts (AutoAWQ awq/modules/linear/gemm.py, gemv.py; vLLM's awq.py reads GEMM the same way):
  GEMM  qweight int32 [K, N/8]: nibble j of word [k, w] holds column 8w + order[j], order 0,2,4,6,1,3,5,7;
        qzeros int32 [K/G, N/8], the same packing; scales fp16 [K/G, N].
  GEMV  qweight int32 [N, K/8]: nibble j of word [n, w] holds column 8w + j;
        qzeros int32 [N, W] packed along the groups the same way, W = calculate_zeros_width (padded);
        scales fp16 [N, 8W], groups beyond K/G zero.
--order sequential packs GEMM without AWQ's interleave: the mistake the tests must catch.

Usage: awq_pack.py SRC OUT TWIN [--version gemm|gemv] [--group-size G] [--not-convert NAME ...] [--order awq|sequential]
Every converted linear needs N % 8 == 0 and K % G == 0 (GEMV also K % 8 == 0); list the others with --not-convert
(the bundled stories260K: --group-size 32 --not-convert mlp).
"""
import argparse
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import load_weights  # noqa: E402  (NumPy; exits 77 without it)

import numpy as np  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
SEQUENTIAL = list(range(8))


def write_safetensors(path, tensors):
    """tensors: name -> NumPy array (float32, float16 or int32), written in safetensors layout."""
    header, blobs, offset = {}, [], 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def quantize(w, group):
    """AutoAWQ's zero-point RTN of w [N, K] (float64): q [N, K] and zero [N, K/G] ints, scale [N, K/G] fp16."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    hi, lo = g.max(-1), g.min(-1)
    scale = (np.maximum(hi - lo, 1e-5) / 15).astype(np.float16)
    s = scale.astype(np.float64)
    zero = np.clip(-np.round(lo / s), 0, 15)
    q = np.clip(np.round(g / s[..., None]) + zero[..., None], 0, 15)
    return q.reshape(n, k).astype(np.int64), zero.astype(np.int64), scale


def pack(values, order):
    """values [..., M] in [0, 16), M % 8 == 0 -> int32 [..., M/8]: nibble j of word w holds element 8w + order[j]."""
    v = values.reshape(*values.shape[:-1], -1, 8)[..., order].astype(np.uint32)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for j in range(8):
        words |= (v[..., j] & 0xF) << np.uint32(4 * j)
    return words.view(np.int32)


def zeros_width(k, group):
    """AutoAWQ's calculate_zeros_width (gemv.py)."""
    multiple = 1 if group >= 128 else {64: 2, 32: 4}[group]
    words = -(-(k // group) // 8)
    return -(-words // multiple) * multiple


def awq_tensors(prefix, q, zero, scale, version, group, order):
    n, k = q.shape
    if version == "gemm":
        return {prefix + ".qweight": pack(q.T, order), prefix + ".qzeros": pack(zero.T, order),
                prefix + ".scales": np.ascontiguousarray(scale.T)}
    width = zeros_width(k, group)
    zpad = np.zeros((n, 8 * width), dtype=np.int64)
    zpad[:, :zero.shape[1]] = zero
    spad = np.zeros((n, 8 * width), dtype=np.float16)
    spad[:, :scale.shape[1]] = scale
    return {prefix + ".qweight": pack(q, SEQUENTIAL), prefix + ".qzeros": pack(zpad, SEQUENTIAL), prefix + ".scales": spad}


def unpack(words, order):
    """The inverse of pack: int32 [..., M/8] -> [..., M] where element 8w + order[j] is nibble j of word w."""
    w = words.view(np.uint32)
    nibbles = np.stack([(w >> np.uint32(4 * j)) & 0xF for j in range(8)], axis=-1)  # [..., M/8, 8] by nibble
    out = np.empty_like(nibbles)
    out[..., order] = nibbles
    return out.reshape(*words.shape[:-1], -1).astype(np.int64)


def dequantize(tensors, prefix, version, group):
    """W [N, K] float32 = (q - zero) * scale of AWQ linear `prefix` read from `tensors` (name -> array)."""
    qweight, qzeros, scales = (tensors[prefix + s] for s in (".qweight", ".qzeros", ".scales"))
    if version == "gemm":
        q, zero, scale = unpack(qweight, AWQ_ORDER).T, unpack(qzeros, AWQ_ORDER).T, scales.T
    else:
        q = unpack(qweight, SEQUENTIAL)
        groups = q.shape[1] // group
        zero, scale = unpack(qzeros, SEQUENTIAL)[:, :groups], scales[:, :groups]
    g = q.shape[1] // zero.shape[1]
    return ((q - np.repeat(zero, g, axis=1)).astype(np.float32) * np.repeat(scale.astype(np.float32), g, axis=1))


def write(src, out, twin, version="gemm", group=128, not_convert=(), order=AWQ_ORDER):
    """Writes the AWQ checkpoint `out` and its float twin `twin` of the float checkpoint `src`."""
    weights = load_weights(src)
    config = json.load(open(os.path.join(src, "config.json")))
    packed, twin_weights = {}, {}
    for name, w in weights.items():
        linear = name.startswith("model.layers.") and name.endswith("_proj.weight")
        if not linear or any(skip in name for skip in not_convert):
            packed[name] = twin_weights[name] = w.astype(np.float32)
            continue
        g = w.shape[1] if group == -1 else group
        n, k = w.shape
        if n % 8 or k % g or (version == "gemv" and k % 8):
            raise ValueError(f"{name}: [{n}, {k}] does not fit AWQ's {version} packing at group size {g} "
                             "(N % 8, K % G); leave it float with --not-convert")
        q, zero, scale = quantize(w, g)
        packed.update(awq_tensors(name[:-len(".weight")], q, zero, scale, version, g, order))
        s = np.repeat(scale.astype(np.float32), g, axis=1)
        z = np.repeat(zero, g, axis=1)
        twin_weights[name] = ((q - z).astype(np.float32) * s).astype(np.float32)
    for directory, tensors in ((out, packed), (twin, twin_weights)):
        os.makedirs(directory, exist_ok=True)
        for f in os.listdir(src):
            if not f.endswith(".safetensors") and not f.endswith(".json") and os.path.isfile(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), directory)
            elif f.endswith(".json") and f not in ("config.json", "model.safetensors.index.json"):
                shutil.copy(os.path.join(src, f), directory)
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    quantized = dict(config)
    quantized["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                        "version": version, "modules_to_not_convert": list(not_convert) or None}
    json.dump(quantized, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump(config, open(os.path.join(twin, "config.json"), "w"), indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("twin")
    p.add_argument("--version", choices=["gemm", "gemv"], default="gemm")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--not-convert", nargs="*", default=[])
    p.add_argument("--order", choices=["awq", "sequential"], default="awq")
    a = p.parse_args()
    write(a.src, a.out, a.twin, a.version, a.group_size, a.not_convert, AWQ_ORDER if a.order == "awq" else SEQUENTIAL)


if __name__ == "__main__":
    main()
