#!/usr/bin/env python3
"""Writes the small random Llama of tests/data/gguf_kquant (README there) as a Hugging Face directory:
config.json, model.safetensors (F32, Python's random.Random(2026) Gaussian weights) and the SentencePiece
tokenizer of assets/models/stories260K (the `small` preset's). Usage: make_tiny.py OUT_DIR"""
import array
import json
import os
import random
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.abspath(__file__)) + "/../../.."
H, I, V, L, KV = 256, 512, 512, 2, 128


def main(out):
    os.makedirs(out)
    for name in ("tokenizer.model", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(ROOT + "/assets/models/stories260K/" + name, out)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "vocab_size": V, "max_position_embeddings": 2048, "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
              "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    with open(out + "/config.json", "w") as f:
        json.dump(config, f, indent=2)
    rng = random.Random(2026)
    tensors = {}

    def mat(rows, cols, std):
        return [rng.gauss(0, std) for _ in range(rows * cols)], [rows, cols]

    tensors["model.embed_tokens.weight"] = mat(V, H, 1.0)
    tensors["lm_head.weight"] = mat(V, H, 0.15)
    tensors["model.norm.weight"] = ([1.0] * H, [H])
    for layer in range(L):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = ([1.0 + 0.1 * rng.gauss(0, 1) for _ in range(H)], [H])
        tensors[p + "post_attention_layernorm.weight"] = ([1.0 + 0.1 * rng.gauss(0, 1) for _ in range(H)], [H])
        tensors[p + "self_attn.q_proj.weight"] = mat(H, H, 0.08)
        tensors[p + "self_attn.k_proj.weight"] = mat(KV, H, 0.08)
        tensors[p + "self_attn.v_proj.weight"] = mat(KV, H, 0.08)
        tensors[p + "self_attn.o_proj.weight"] = mat(H, H, 0.08)
        tensors[p + "mlp.gate_proj.weight"] = mat(I, H, 0.08)
        tensors[p + "mlp.up_proj.weight"] = mat(I, H, 0.08)
        tensors[p + "mlp.down_proj.weight"] = mat(H, I, 0.06)
    header, blobs, offset = {}, [], 0
    for name, (values, shape) in tensors.items():
        blob = array.array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(out + "/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main(sys.argv[1])
