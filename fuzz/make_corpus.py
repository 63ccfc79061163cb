#!/usr/bin/env python3
"""Regenerates fuzz/corpus/<target>/ (seed inputs) and fuzz/data/ (fixed
files the harnesses load) from the real files of the repository.

Every seed is small (< 100 KB): big real files (the Llama 3 / Qwen3
tokenizer.json, GPT-2's vocab.json) are cut down to a few hundred tokens
with their real normalizers, pre-tokenizers, post-processors and decoders;
tools/fuzz.sh can add repo folders as extra corpus directories.

Run from anywhere: python3 fuzz/make_corpus.py (deterministic output).
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")
DATA = os.path.join(FUZZ, "data")
LIMIT = 100_000


def rd(rel, mode="r"):
    with open(os.path.join(ROOT, rel), mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        return f.read()


def put(target, name, content):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    assert len(content) < LIMIT, (target, name, len(content))
    with open(os.path.join(d, name), "wb") as f:
        f.write(content)


def put_data(rel, content):
    p = os.path.join(DATA, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    assert len(content) < LIMIT, (rel, len(content))
    with open(p, "wb") as f:
        f.write(content)


def dumps(j, **kw):
    return json.dumps(j, ensure_ascii=False, **kw)


# ---------------------------------------------------------------- safetensors

def safetensors(tensors, metadata=None, pad=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad is not None:
        h += b" " * ((-len(h)) % pad)
    return struct.pack("<Q", len(h)) + h + data


def make_safetensors():
    real = rd("assets/models/stories260K/model.safetensors", "rb")
    n = struct.unpack("<Q", real[:8])[0]
    header = json.loads(real[8:8 + n])
    # The real header with no data (every offset points past the end).
    put("safetensors", "stories260K_header_only", real[:8 + n])
    # Real tensors, small ones, with their real bytes.
    small = [(k, v) for k, v in header.items() if k != "__metadata__" and v["data_offsets"][1] - v["data_offsets"][0] <= 4096]
    data0 = 8 + n
    picked = [(k, v["dtype"], v["shape"], real[data0 + v["data_offsets"][0]:data0 + v["data_offsets"][1]]) for k, v in small[:6]]
    put("safetensors", "stories260K_norms", safetensors(picked, {"format": "pt"}, pad=8))
    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    put("safetensors", "dtypes", safetensors([
        ("a.f32", "F32", [2, 2], f32),
        ("b.f16", "F16", [3], struct.pack("<3H", 0x3c00, 0xc000, 0x7c00)),
        ("c.bf16", "BF16", [1, 2], struct.pack("<2H", 0x3f80, 0xff80)),
        ("d.f64", "F64", [1], struct.pack("<d", 1e300)),
        ("e.i64", "I64", [1], struct.pack("<q", -1)),
        ("f.i32", "I32", [2], struct.pack("<2i", 1, 2)),
        ("g.i16", "I16", [1], struct.pack("<h", 7)),
        ("h.i8", "I8", [2], b"\x80\x7f"),
        ("i.u8", "U8", [2], b"\x00\xff"),
        ("j.bool", "BOOL", [1], b"\x01"),
    ], {"format": "pt", "note": "all dtypes"}))
    put("safetensors", "scalar_and_empty", safetensors([
        ("scalar", "F32", [], struct.pack("<f", 42.0)),
        ("empty", "F16", [0, 8], b""),
        ("deep", "U8", [1, 1, 1, 1, 1, 1, 1, 2], b"\x01\x02"),
    ]))
    put("safetensors", "no_tensors", safetensors([], {"format": "pt"}))
    put("safetensors", "truncated", safetensors([("w", "F32", [4], f32)])[:-3])
    put("safetensors", "tiny", struct.pack("<Q", 2) + b"{}")


def make_safetensors_index():
    wm = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
          "lm_head.weight": "model-00002-of-00002.safetensors"}
    put("safetensors_index", "two_shards.json", dumps({"metadata": {"total_size": 96}, "weight_map": wm}, indent=2))
    put("safetensors_index", "one_shard.json", dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))
    put("safetensors_index", "missing_tensor.json",
        dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}))
    put("safetensors_index", "bad_names.json",
        dumps({"weight_map": {"a": "../model-00001-of-00002.safetensors", "b": "..", "c": ""}}))


# ---------------------------------------------------------------- configs

def make_configs():
    stories = rd("assets/models/stories260K/config.json")
    put("hf_config", "stories260K.json", stories)
    base = json.loads(stories)
    llama3 = dict(base, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                  bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                  rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    del llama3["head_dim"]
    put("hf_config", "llama3.json", dumps(llama3, indent=2))
    mistral = dict(base, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096,
                   rope_scaling={"type": "linear", "factor": 2.0})
    put("hf_config", "mistral.json", dumps(mistral, indent=2))
    qwen2 = dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=True,
                 sliding_window=12, max_window_layers=1, num_hidden_layers=3,
                 layer_types=["full_attention", "sliding_attention", "sliding_attention"], tie_word_embeddings=False)
    put("hf_config", "qwen2.json", dumps(qwen2, indent=2))
    qwen3 = dict(base, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16, attention_bias=True,
                 rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, num_experts=1)
    del qwen3["rope_scaling"]
    put("hf_config", "qwen3.json", dumps(qwen3, indent=2))
    bare = {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 4}
    put("hf_config", "bare.json", dumps(bare))

    put("generation_config", "stories260K.json", rd("assets/models/stories260K/generation_config.json"))
    put("generation_config", "llama3.json", dumps({"bos_token_id": 1, "do_sample": True, "eos_token_id": [2, 3, 4],
                                                   "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.43.0"},
                                                  indent=2))
    put("generation_config", "scalar_eos.json", dumps({"eos_token_id": 2, "bos_token_id": None}))
    put("generation_config", "out_of_vocab.json", dumps({"eos_token_id": [151645, 151643], "bos_token_id": 151643}))
    put("generation_config", "empty.json", "{}")


# ---------------------------------------------------------------- tokenizers

def byte_level_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def shrink_bpe(tok, keep, extra_merge_limit=800):
    """tokenizer.json `tok` with its vocab cut to ids < keep (plus the 256 byte-level
    characters) and its merges cut to those whose parts and result survive;
    added tokens renumbered after the vocab."""
    model = tok["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    for ch in byte_level_chars():
        if ch not in vocab:
            vocab[ch] = len(vocab) + keep
    ids = sorted(set(vocab.values()))
    remap = {old: new for new, old in enumerate(ids)}
    vocab = {t: remap[i] for t, i in vocab.items()}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
        if len(merges) >= extra_merge_limit:
            break
    out = dict(tok)
    out["model"] = dict(model, vocab=vocab, merges=merges)
    added = []
    for k, a in enumerate(tok.get("added_tokens") or []):
        if k >= 12:
            break
        added.append(dict(a, id=len(vocab) + k))
    out["added_tokens"] = added
    return out


def template_processing(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def make_tokenizers():
    llama3 = json.loads(rd("assets/tokenizers/llama3/tokenizer.json"))
    l3 = shrink_bpe(llama3, 400)
    bot = l3["added_tokens"][0]
    l3_tp = dict(l3, post_processor={"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template_processing(bot["content"], bot["id"])]})
    qwen3 = json.loads(rd("assets/tokenizers/qwen3/tokenizer.json"))
    q3 = shrink_bpe(qwen3, 400)
    for name, t in [("llama3_small.json", l3), ("llama3_small_template.json", l3_tp), ("qwen3_small.json", q3)]:
        put("tokenizer_json", name, dumps(t, separators=(",", ":")))
    put_data("llama3_small/tokenizer.json", dumps(l3_tp, separators=(",", ":")))

    # Llama 2 as converted to tokenizer.json (SentencePiece-style BPE, byte fallback).
    chars = "\u2581abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in chars:
        vocab.setdefault(c, len(vocab))
    merges = []
    for w in ["\u2581t", "\u2581th", "\u2581the", "he", "\u2581a", "in", "er", "\u2581w", "\u2581wor", "ld"]:
        pass
    for a, b in [("\u2581", "t"), ("\u2581t", "h"), ("\u2581th", "e"), ("h", "e"), ("\u2581", "a"), ("i", "n"),
                 ("e", "r"), ("\u2581", "w"), ("o", "r"), ("\u2581w", "or"), ("l", "d")]:
        vocab.setdefault(a + b, len(vocab))
        merges.append(a + " " + b)
    added = lambda c, i, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False: {
        "id": i, "content": c, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
        "normalized": normalized, "special": special}
    spm = {"version": "1.0",
           "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2), added("[MASK]", len(vocab), lstrip=True)],
           "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                              {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
           "pre_tokenizer": None,
           "post_processor": template_processing("<s>", 1),
           "decoder": {"type": "Sequence", "decoders": [
               {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
               {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                     "vocab": vocab, "merges": merges}}
    put("tokenizer_json", "llama2_converted.json", dumps(spm, indent=1))
    # Metaspace pre-tokenizer and decoder (Mistral-style conversions), Digits, regex Replace, Strip.
    meta = dict(spm, normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                                                     {"type": "Strip", "strip_left": True, "strip_right": False},
                                                                     {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
                pre_tokenizer={"type": "Sequence", "pretokenizers": [
                    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
                    {"type": "Digits", "individual_digits": True}]},
                decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True})
    put("tokenizer_json", "metaspace_digits.json", dumps(meta, indent=1))
    # Characters only, with every added-token flag, Split behaviours and BERT/RoBERTa post-processors.
    cv = {c: i for i, c in enumerate("abc xyzHELOWRDhelowrd<>!")}
    for i, (proc, beh) in enumerate([
            ({"type": "BertProcessing", "sep": ["!", 23], "cls": ["<", 21]}, "Removed"),
            ({"type": "RobertaProcessing", "sep": [">", 22], "cls": ["<", 21], "trim_offsets": True, "add_prefix_space": False}, "MergedWithPrevious"),
            (None, "MergedWithNext"), (None, "Contiguous")]):
        t = {"added_tokens": [added("<mask>", 100, lstrip=True, rstrip=True), added("<s>", 101),
                              added("hello", 102, special=False, normalized=True, single_word=True),
                              added("WORLD", 103, special=False, normalized=True)],
             "normalizer": {"type": "NFD"} if i % 2 else {"type": "NFKD"},
             "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+" if i % 2 else "[a-c]"}, "behavior": beh,
                               "invert": i == 3},
             "post_processor": proc,
             "model": {"type": "BPE", "vocab": cv, "merges": [["h", "e"], ["l", "o"]] if i % 2 else ["h e", "l o"],
                       "continuing_subword_prefix": "##" if i == 2 else None, "end_of_word_suffix": "</w>" if i == 3 else None,
                       "unk_token": "!" if i == 0 else None, "ignore_merges": i == 1}}
        put("tokenizer_json", "chars_%d.json" % i, dumps(t, indent=1))

    # GPT-2 (vocab.json + merges.txt) cut down, for the tokenizer_config harness.
    gv = json.loads(rd("assets/tokenizers/gpt2/vocab.json"))
    keep = {t: i for t, i in gv.items() if i < 600}
    keep["<|endoftext|>"] = len(keep)
    lines = rd("assets/tokenizers/gpt2/merges.txt").split("\n")
    gm = [lines[0]]
    for ln in lines[1:]:
        p = ln.split(" ")
        if len(p) == 2 and p[0] in keep and p[1] in keep and p[0] + p[1] in keep:
            gm.append(ln)
    put_data("gpt2_small/vocab.json", dumps(keep, separators=(",", ":")))
    put_data("gpt2_small/merges.txt", "\n".join(gm) + "\n")
    put_data("stories260K/tokenizer.model", rd("assets/models/stories260K/tokenizer.model", "rb"))

    # tokenizer_config.json seeds: the real ones and variants of each field read.
    for name, rel in [("stories260K.json", "assets/models/stories260K/tokenizer_config.json"),
                      ("llama3.json", "assets/tokenizers/llama3/tokenizer_config.json"),
                      ("qwen3.json", "assets/tokenizers/qwen3/tokenizer_config.json")]:
        put("tokenizer_config", name, rd(rel))
    put("tokenizer_config", "llama_fast_flags.json", dumps({
        "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "add_eos_token": True,
        "bos_token": {"content": "<|begin_of_text|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "__type": "AddedToken"},
        "eos_token": "<|end_of_text|>", "unk_token": None, "pad_token": "<|end_of_text|>"}, indent=2))
    put("tokenizer_config", "template_list.json", dumps({
        "bos_token": "<s>", "eos_token": "</s>",
        "chat_template": [{"name": "default", "template": rd("tests/data/chat_templates/chatml.jinja")},
                          {"name": "tool_use", "template": "{{ tools|tojson }}"}]}))
    put("tokenizer_config", "gpt2.json", dumps({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                                                 "eos_token": "<|endoftext|>", "add_bos_token": True,
                                                 "chat_template": rd("assets/tokenizers/llama2/llama2_chat_template.jinja")}))

    # tokenizer_encode seeds: selector byte (which real tokenizer) + text.
    texts = [
        "Once upon a time, there was a little girl named Lily.",
        "Hello world! Don't  stop\n\n\tnow 12345 3.14 caf\u00e9 cafe\u0301 \ufb01 \u00bd \uff21\uff22 \u4e2d\u6587 \ud55c\uad6d\uc5b4 "
        "\U0001f999 \U0001f44d\U0001f3fd \u00a0\u200b \u043f\u0440\u0438\u0432\u0435\u0442",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><s>[INST] x [/INST]</s><|im_start|>a<|im_end|><|endoftext|>",
        "\u2581\u2581 <0x41> \r\n    \u3000\u3000 " + "a" * 40,
    ]
    inp = rd("tests/data/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf.inp").split("\n__ggml_vocab_test__\n")
    texts += [t for t in inp if t.strip()][:12]
    for sel in range(5):
        for k, t in enumerate(texts):
            put("tokenizer_encode", "t%d_%02d" % (sel, k), bytes([sel]) + t.encode("utf-8"))
    put("tokenizer_encode", "invalid_utf8", b"\x00ab\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98 end")

    # tokenizer_time seeds: selector byte + a unit the target repeats (the pathological texts of
    # tests/hostile_text_test.cc: combining marks, runs of one character, of spaces, digits, emoji ZWJ, jamo).
    # Selector byte, head length, head, unit.
    units = [("a", "\u0301\u0316"), ("", "a"), ("x", " "), ("x", "\n"), ("", "7"), ("", "!"),
             ("", "\U0001F468\u200D\U0001F469"), ("", "\u1100\u1161\u11A8"), ("", "\u4e2d"), ("", "e\u0301 "),
             ("", "Hello, world. "), ("x", "  \t\r\n")]
    for sel in range(5):
        for k, (head, unit) in enumerate(units):
            h = head.encode("utf-8")
            put("tokenizer_time", "t%d_%02d" % (sel, k), bytes([sel, len(h)]) + h + unit.encode("utf-8"))


# ---------------------------------------------------------------- jinja

def chat_templates():
    out = []
    for rel in ["tests/data/chat_templates/chatml.jinja", "tests/data/chat_templates/features.jinja",
                "tests/data/chat_templates/llama3.jinja", "tests/data/chat_templates/qwen3.jinja",
                "assets/tokenizers/llama2/llama2_chat_template.jinja",
                "assets/tokenizers/llama2/mistral_v0.1_chat_template.jinja"]:
        out.append((os.path.splitext(os.path.basename(rel))[0], rd(rel)))
    for n in ["llama3", "qwen3"]:
        t = json.loads(rd("assets/tokenizers/%s/tokenizer_config.json" % n))["chat_template"]
        if all(t != s for _, s in out):
            out.append((n + "_config", t))
    return out


def make_jinja():
    cases = json.loads(rd("tests/data/chat_messages.json"))
    tools_case = {"messages": [{"role": "user", "content": "weather?"},
                               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                                   "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                               {"role": "tool", "content": "{\"t\": 20}"}],
                  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                  "add_generation_prompt": True, "enable_thinking": False}
    cases.append(tools_case)
    for k, (name, src) in enumerate(chat_templates()):
        for c in (0, 3, 5, len(cases) - 1):
            ctx = dict(cases[c % len(cases)], bos_token="<s>", eos_token="</s>")
            put("jinja", "%s_%d" % (name, c), src.encode() + b"\0" + dumps(ctx).encode())
    snippets = [
        "{{ 'a' ~ 1 ~ none }} {{ [1,2,3][1:] }} {{ {'k': [1, 2]}|tojson(indent=2) }} {{ 7 // 2 }} {{ 2 ** 10 }}",
        "{% for k, v in d.items() %}{{ loop.index }}{{ k }}={{ v }}{% if loop.last %}!{% endif %}{% else %}empty{% endfor %}",
        "{% set ns = namespace(x=0) %}{% for i in range(5) %}{% set ns.x = ns.x + i %}{% if i > 2 %}{% break %}{% endif %}{% endfor %}{{ ns.x }}",
        "{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('no system') }}{%- endif -%}{{ messages|length }}",
        "{{ 'Hello World'.split(' ')|map('upper')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
        "{% set c %}{{ x|default('dflt') }}{% endset %}{{ c|trim|replace('d', 'D')|title }} {{ x is defined }} {{ 3 is odd }}",
        "{{ '%s'|length }}{{ ('a' * 3) }}{{ 1 if true else 2 }}{{ [3,1,2]|reverse|list }}{{ 'abc'[::-1] }}{# c #}{% generation %}g{% endgeneration %}",
    ]
    for k, s in enumerate(snippets):
        put("jinja", "snippet_%d" % k, s.encode() + b"\0" + dumps({"messages": cases[3]["messages"], "d": {"a": 1, "b": [2]}}).encode())
    put("jinja", "no_context", b"{{ messages[0].content }}")

    for c, case in enumerate(cases[:8] + [tools_case]):
        for sel in (0, 3):
            body = dumps({k: v for k, v in case.items() if k != "add_generation_prompt"})
            put("jinja_chat", "c%02d_t%d" % (c, sel), bytes([sel * 2 + (1 if case.get("add_generation_prompt") else 0)]) + body.encode())
    put("jinja_chat", "array", b"\x05" + dumps(cases[2]["messages"]).encode())


# ---------------------------------------------------------------- OpenAI requests

def make_openai():
    reqs = {
        "chat_min.json": {"model": "woq", "messages": [{"role": "user", "content": "Hi"}]},
        "chat_full.json": {"model": "woq", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None, "name": "bot"}],
            "max_completion_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": -5,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 1, "stop": ["\n\n", "User:"],
            "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 5,
            "user": "u1", "chat_template_kwargs": {"enable_thinking": False, "x": "y", "n": 3},
            "echo": False, "tools": [], "response_format": {"type": "text"}, "logit_bias": {}},
        "completion.json": {"model": "woq", "prompt": "Once upon a time", "max_tokens": 16, "logprobs": 3,
                            "stop": "\n", "suffix": "", "best_of": 1, "seed": 18446744073709551615},
        "completion_list.json": {"prompt": ["Once upon a time"], "temperature": 0, "stream": False},
        "wrong_model.json": {"model": "gpt-4", "prompt": "x"},
        "bad_types.json": {"messages": [{"role": 1}], "prompt": 3, "temperature": "hot", "n": 2},
    }
    for name, r in reqs.items():
        put("openai_request", name, dumps(r))


# ---------------------------------------------------------------- GGUF

# Small complete GGUF files written from the specification (ggml/docs/gguf.md):
# magic, version, tensor_count, metadata_kv_count, key/value pairs, tensor
# infos, padding to general.alignment, tensor data at aligned offsets.
GGUF_TYPES = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
              "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "str": (8, None), "u64": (10, "<Q"),
              "i64": (11, "<q"), "f64": (12, "<d")}
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K = 0, 1, 2, 8, 12, 14


def gguf_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    """t: a scalar type name, "str", or ("arr", element type)."""
    if isinstance(t, tuple):
        return struct.pack("<IQ", GGUF_TYPES[t[1]][0], len(v)) + b"".join(gguf_value(t[1], x) for x in v)
    if t == "str":
        return gguf_str(v)
    return struct.pack(GGUF_TYPES[t][1], v)


def gguf_pad(n, a):
    return (n + a - 1) // a * a


def gguf_file(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne innermost first, ggml type, data)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gguf_str(k) + struct.pack("<I", 9 if isinstance(t, tuple) else GGUF_TYPES[t][0]) + gguf_value(t, v)
    data, offsets = b"", []
    for _, _, _, raw in tensors:
        data += b"\0" * (gguf_pad(len(data), alignment) - len(data))
        offsets.append(len(data))
        data += raw
    for (name, ne, gt, _), off in zip(tensors, offsets):
        out += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, off)
    if tensors:
        out += b"\0" * (gguf_pad(len(out), alignment) - len(out)) + data
    return out


def gguf_f32(n, seed):
    return b"".join(struct.pack("<f", ((i * 7 + seed * 13) % 17 - 8) / 16.0) for i in range(n))


def gguf_f16(n, seed):
    return b"".join(struct.pack("<e", ((i * 5 + seed) % 11 - 5) / 8.0) for i in range(n))


def gguf_q4_0(n, seed):  # blocks of 32: half d, 16 bytes of nibbles
    return b"".join(struct.pack("<e", 0.01 * (b + 1)) + bytes((i * 37 + b + seed) % 256 for i in range(16))
                    for b in range(n // 32))


def gguf_q8_0(n, seed):  # blocks of 32: half d, 32 int8
    return b"".join(struct.pack("<e", 0.02) + bytes((i * 11 + b + seed) % 256 for i in range(32)) for b in range(n // 32))


def gguf_q4_K(n, seed):  # blocks of 256: half d, half dmin, 12 bytes of scales, 128 of nibbles
    return b"".join(struct.pack("<ee", 0.01, 0.005) + bytes((i * 29 + b + seed) % 64 for i in range(12)) +
                    bytes((i * 13 + seed) % 256 for i in range(128)) for b in range(n // 256))


def gguf_q6_K(n, seed):  # blocks of 256: ql[128], qh[64], int8 scales[16], half d
    return b"".join(bytes((i * 31 + b + seed) % 256 for i in range(192)) + bytes((i * 3 + 1) % 64 for i in range(16)) +
                    struct.pack("<e", 0.003) for b in range(n // 256))


def gguf_model(arch, hidden=8, ffn=12, heads=2, kv_heads=1, head_dim=None, vocab=6, layers=1, tied=False,
               qkv_bias=False, qk_norm=False, linear=None, extra_kvs=(), extra_tensors=(), tokenizer="gpt2"):
    """A tiny complete model in convert_hf_to_gguf.py's layout (F32 unless `linear` gives
    (ggml type, encoder) for the block matrices; their K must then fit the block size)."""
    head_dim = head_dim or hidden // heads
    a = arch + "."
    kvs = [("general.architecture", "str", arch), ("general.name", "str", "tiny " + arch),
           ("general.file_type", "u32", 0), (a + "context_length", "u32", 64), (a + "embedding_length", "u32", hidden),
           (a + "feed_forward_length", "u32", ffn), (a + "block_count", "u32", layers),
           (a + "attention.head_count", "u32", heads), (a + "attention.head_count_kv", "u32", kv_heads),
           (a + "rope.freq_base", "f32", 500000.0), (a + "attention.layer_norm_rms_epsilon", "f32", 1e-5),
           (a + "rope.dimension_count", "u32", head_dim)]
    if head_dim != hidden // heads:
        kvs.append((a + "attention.key_length", "u32", head_dim))
        kvs.append((a + "attention.value_length", "u32", head_dim))
    tokens = ["<s>", "</s>"] + ["t%d" % i for i in range(vocab - 2)]
    kvs += [("tokenizer.ggml.model", "str", tokenizer), ("tokenizer.ggml.tokens", ("arr", "str"), tokens),
            ("tokenizer.ggml.token_type", ("arr", "i32"), [3, 3] + [1] * (vocab - 2)),
            ("tokenizer.ggml.bos_token_id", "u32", 0), ("tokenizer.ggml.eos_token_id", "u32", 1)]
    if tokenizer == "llama":
        kvs.append(("tokenizer.ggml.scores", ("arr", "f32"), [0.0] * 2 + [-float(i) for i in range(vocab - 2)]))
    else:
        kvs.append(("tokenizer.ggml.merges", ("arr", "str"), ["t 0", "t 1"]))
    kvs += list(extra_kvs)
    seed = [0]

    def f32(*ne):
        seed[0] += 1
        n = 1
        for d in ne:
            n *= d
        return gguf_f32(n, seed[0])

    def mat(k, rows):
        seed[0] += 1
        if linear is None:
            return GGML_F32, gguf_f32(k * rows, seed[0])
        return linear[0], linear[1](k * rows, seed[0])
    t = [("token_embd.weight", [hidden, vocab], GGML_F32, f32(hidden, vocab)),
         ("output_norm.weight", [hidden], GGML_F32, f32(hidden))]
    if not tied:
        t.append(("output.weight", [hidden, vocab], GGML_F32, f32(hidden, vocab)))
    for l in range(layers):
        p = "blk.%d." % l
        t.append((p + "attn_norm.weight", [hidden], GGML_F32, f32(hidden)))
        for name, k, rows in [("attn_q", hidden, heads * head_dim), ("attn_k", hidden, kv_heads * head_dim),
                              ("attn_v", hidden, kv_heads * head_dim), ("attn_output", heads * head_dim, hidden),
                              ("ffn_gate", hidden, ffn), ("ffn_up", hidden, ffn), ("ffn_down", ffn, hidden)]:
            gt, raw = mat(k, rows)
            t.append((p + name + ".weight", [k, rows], gt, raw))
        if qkv_bias:
            for name, rows in [("attn_q", heads * head_dim), ("attn_k", kv_heads * head_dim), ("attn_v", kv_heads * head_dim)]:
                t.append((p + name + ".bias", [rows], GGML_F32, f32(rows)))
        if qk_norm:
            t.append((p + "attn_q_norm.weight", [head_dim], GGML_F32, f32(head_dim)))
            t.append((p + "attn_k_norm.weight", [head_dim], GGML_F32, f32(head_dim)))
        t.append((p + "ffn_norm.weight", [hidden], GGML_F32, f32(hidden)))
    return kvs, t + list(extra_tensors)


def make_gguf():
    put("gguf", "llama_f32.gguf", gguf_file(*gguf_model("llama", layers=2)))
    put("gguf", "llama_v2_bias_tied.gguf", gguf_file(*gguf_model("llama", tied=True, qkv_bias=True,
                                                                 extra_kvs=[("tokenizer.ggml.eot_token_id", "u32", 5)]),
                                                     version=2))
    put("gguf", "qwen2.gguf", gguf_file(*gguf_model("qwen2", qkv_bias=True, heads=4, kv_heads=2,
                                                    extra_kvs=[("qwen2.rope.scaling.type", "str", "linear"),
                                                               ("qwen2.rope.scaling.factor", "f32", 4.0)])))
    put("gguf", "qwen3_key_length.gguf", gguf_file(*gguf_model("qwen3", qk_norm=True, head_dim=8, tied=True)))
    # Llama 3 style: rope_freqs (llama3 scaling), Q4_0 / Q8_0 block matrices, alignment 64.
    q4 = gguf_model("llama", hidden=32, ffn=32, heads=4, kv_heads=2, linear=(GGML_Q4_0, gguf_q4_0),
                    extra_kvs=[("general.alignment", "u32", 64)],
                    extra_tensors=[("rope_freqs.weight", [4], GGML_F32, struct.pack("<4f", 1.0, 1.5, 4.0, 8.0))])
    put("gguf", "llama3_q4_0_rope_freqs.gguf", gguf_file(*q4, alignment=64))
    put("gguf", "llama_q8_0.gguf", gguf_file(*gguf_model("llama", hidden=32, ffn=32, heads=2, kv_heads=2,
                                                         linear=(GGML_Q8_0, gguf_q8_0), tokenizer="llama")))
    # K-quants (one 256-block rows), F16, an integer and an IQ type, alignment 1.
    kvs, tensors = gguf_model("llama", extra_kvs=[("general.alignment", "u32", 1)])
    tensors = [(n, ne, gt, raw) for n, ne, gt, raw in tensors if not n.startswith("blk.0.ffn_")]
    tensors += [("blk.0.ffn_gate.weight", [256, 2], GGML_Q4_K, gguf_q4_K(512, 1)),
                ("blk.1.ffn_gate.weight", [512, 1], GGML_Q6_K, gguf_q6_K(512, 3)),
                ("blk.0.ffn_up.weight", [256, 1], GGML_F16, gguf_f16(256, 2)),
                ("blk.0.ffn_down.weight", [256, 1], 26, struct.pack("<256i", *range(256))),  # i32
                ("blk.1.ffn_down.weight", [256, 1], 20, bytes(range(144)))]  # iq4_nl: 8 blocks of 18
    put("gguf", "k_quants_align1.gguf", gguf_file(kvs, tensors, alignment=1))
    # Every metadata type, scalars and arrays (v2), with one tensor.
    every = [("general.architecture", "str", "llama"), ("a.u8", "u8", 255), ("a.i8", "i8", -128), ("a.u16", "u16", 65535),
             ("a.i16", "i16", -32768), ("a.u32", "u32", 4294967295), ("a.i32", "i32", -2147483648),
             ("a.f32", "f32", 0.5), ("a.bool", "bool", True), ("a.str", "str", "h\u00e9llo \U0001f999"),
             ("a.u64", "u64", 18446744073709551615), ("a.i64", "i64", -9223372036854775808), ("a.f64", "f64", 1e300),
             ("a.strs", ("arr", "str"), ["", "x", "\u4e2d"]), ("a.u8s", ("arr", "u8"), [0, 1]),
             ("a.i16s", ("arr", "i16"), [-1, 1]), ("a.u32s", ("arr", "u32"), [7, 8, 9]),
             ("a.u64s", ("arr", "u64"), [1, 18446744073709551615]), ("a.f32s", ("arr", "f32"), [1.5, -2.0]),
             ("a.f64s", ("arr", "f64"), [0.25]), ("a.bools", ("arr", "bool"), [True, False]),
             ("a.empty", ("arr", "i32"), [])]
    put("gguf", "every_type_v2.gguf", gguf_file(every, [("w", [4, 2], GGML_F16, gguf_f16(8, 0))], version=2))
    # A split set's first part (the harness writes the matching second part, which holds output.weight).
    kvs, tensors = gguf_model("llama", tied=True, extra_kvs=[("split.no", "u16", 0), ("split.count", "u16", 2),
                                                             ("split.tensors.count", "i32", 13)])
    put("gguf", "split_part1.gguf", gguf_file(kvs, tensors))
    # Metadata only (as the vocab-only files), and an empty header.
    put("gguf", "metadata_only.gguf", gguf_file(gguf_model("qwen2")[0], []))
    put("gguf", "empty.gguf", gguf_file([], []))

    def dict_bytes(b):
        return '"' + "".join(chr(c) if 0x20 <= c < 0x7f and chr(c) not in '"\\' else "\\x%02X" % c for c in b) + '"'
    entries = [b"GGUF", struct.pack("<I", 3), struct.pack("<I", 2), struct.pack("<I", 1)]
    entries += [struct.pack("<I", v) for v in range(13)] + [struct.pack("<I", v) for v in (14, 20, 26, 28, 30, 255)]
    entries += [struct.pack("<Q", v) for v in (0, 1, 2, 4, 8, 32, 256, 1 << 31, 1 << 32, 1 << 62, 1 << 63, (1 << 64) - 1)]
    entries += [struct.pack("<e", 1.0), struct.pack("<f", 1.0), struct.pack("<f", float("nan")), struct.pack("<d", 1e300)]
    keys = ["general.architecture", "general.alignment", "general.name", "general.file_type",
            "general.quantization_version", "split.no", "split.count", "split.tensors.count",
            "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
            "llama", "qwen2", "qwen3", "gpt2", "linear", "yarn", "none", "token_embd.weight", "output_norm.weight",
            "output.weight", "rope_freqs.weight", "blk.0.", "blk.1.", "blk.4096."]
    for arch in ("llama.", "qwen2.", "qwen3."):
        keys += [arch + k for k in ("context_length", "embedding_length", "feed_forward_length", "block_count",
                                    "attention.head_count", "attention.head_count_kv", "attention.key_length",
                                    "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
                                    "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
                                    "expert_count", "expert_used_count", "vocab_size")]
    keys += [s + ".weight" for s in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                     "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down", "attn_qkv",
                                     "ffn_gate_up")] + ["attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"]
    for k in keys:
        b = k.encode()
        entries += [b, struct.pack("<Q", len(b)) + b]
    lines, seen = ["# GGUF magic, versions, value and ggml type numbers, lengths and counts, the keys and",
                   "# tensor names src/io/gguf_model.cc reads (with their length prefixes). Generated by fuzz/make_corpus.py."], set()
    for e in entries:
        if e not in seen:
            seen.add(e)
            lines.append(dict_bytes(e))
    with open(os.path.join(FUZZ, "gguf.dict"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- dictionaries

def dict_entry(s):
    out = ""
    for b in s.encode("utf-8"):
        c = chr(b)
        out += "\\x%02X" % b if b < 0x20 or b >= 0x7f or c in '"\\' else c
    return '"' + out + '"'


JSON_SYNTAX = ["{", "}", "[", "]", ":", ",", '"', '""', "{}", "[]", "null", "true", "false", "0", "-1", "1", "2", "0.5",
               "-0", "1e308", "1E400", "1e-7", "NaN", "18446744073709551615", "18446744073709551616",
               "9223372036854775807", "9223372036854775808", "-9223372036854775808", "4294967296", "2147483648",
               "\\u0000", "\\ud800", "\\udc00", "\\uffff", '\\"', "\\\\", "\\n", "\\/"]

JSON_KEYS = {
    "safetensors": ["__metadata__", "dtype", "shape", "data_offsets", "F64", "F32", "F16", "BF16", "I64", "I32", "I16",
                    "I8", "U8", "BOOL", "F8_E4M3", "format", "pt", "weight_map", "metadata", "total_size",
                    "model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "..",
                    "model.embed_tokens.weight", "lm_head.weight"],
    "hf_config": ["architectures", "model_type", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                  "Qwen3ForCausalLM", "llama", "mistral", "qwen2", "qwen3", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                  "max_position_embeddings", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
                  "full_attention", "sliding_attention", "hidden_act", "silu", "rms_norm_eps", "rope_theta",
                  "rope_scaling", "rope_parameters", "rope_type", "type", "factor", "low_freq_factor",
                  "high_freq_factor", "original_max_position_embeddings", "linear", "llama3", "default", "yarn",
                  "dynamic", "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id",
                  "num_experts", "num_local_experts", "n_routed_experts", "pad_token_id", "torch_dtype", "do_sample",
                  "temperature", "top_p", "top_k"],
    "tokenizer": ["model", "BPE", "Unigram", "WordPiece", "vocab", "merges", "unk_token", "fuse_unk", "byte_fallback",
                  "ignore_merges", "continuing_subword_prefix", "end_of_word_suffix", "dropout", "added_tokens", "id",
                  "content", "single_word", "lstrip", "rstrip", "normalized", "special", "normalizer", "pre_tokenizer",
                  "post_processor", "decoder", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "prepend",
                  "Replace", "pattern", "String", "Regex", "Strip", "strip_left", "strip_right", "Sequence",
                  "normalizers", "pretokenizers", "decoders", "processors", "ByteLevel", "add_prefix_space",
                  "trim_offsets", "use_regex", "Split", "behavior", "invert", "Removed", "Isolated",
                  "MergedWithPrevious", "MergedWithNext", "Contiguous", "Digits", "individual_digits", "Metaspace",
                  "replacement", "prepend_scheme", "first", "always", "never", "split", "ByteFallback", "Fuse", "start",
                  "stop", "TemplateProcessing", "single", "pair", "SpecialToken", "type_id", "special_tokens", "ids",
                  "tokens", "A", "B", "BertProcessing", "RobertaProcessing", "cls", "sep", "<s>", "</s>", "<unk>",
                  "<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>",
                  "\u2581", "\u0120", "<0x41>", "(?i:", "\\\\p{L}", "\\\\p{N}", "(?!\\\\S)", "\\\\s+", ".*", "(a+)+$",
                  "\\\\C", "tokenizer_class", "LlamaTokenizer", "LlamaTokenizerFast", "GPT2Tokenizer",
                  "GemmaTokenizerFast", "bos_token", "eos_token", "pad_token", "add_bos_token", "add_eos_token",
                  "chat_template", "name", "template", "added_tokens_decoder", "model_max_length"],
    "openai": ["model", "woq", "messages", "role", "system", "user", "assistant", "tool", "content", "type", "text",
               "image_url", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
               "presence_penalty", "frequency_penalty", "n", "stop", "stream", "stream_options", "include_usage",
               "logprobs", "top_logprobs", "chat_template_kwargs", "enable_thinking", "add_generation_prompt",
               "bos_token", "echo", "suffix", "best_of", "logit_bias", "tools", "functions", "response_format",
               "json_object", "tool_choice", "parallel_tool_calls", "name"],
}

JINJA = ["{{", "}}", "{%", "%}", "{#", "#}", "{{-", "-}}", "{%-", "-%}", "{%+", "|", ".", "(", ")", "[", "]", "{", "}",
         ",", ":", "~", "+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "=", "'", '"', "\\n",
         "\\\\", "\\x", "\\u", "::-1", "[1:]", "[:-1]", "0", "1", "-1", "1e308", "9223372036854775807", "9999999999",
         "0.5", " if ", " elif ", " else ", " endif ", " for ", " in ", " endfor ", " set ", " endset ", " break ",
         " continue ", " not ", " and ", " or ", " is ", " recursive ", "generation", "endgeneration", "macro",
         "endmacro", "call", "include", "extends", "block", "filter", "raw", "endraw", "with", "true", "false", "True",
         "False", "none", "None", "null", "namespace(", "range(", "raise_exception(", "loop.index", "loop.index0",
         "loop.revindex", "loop.revindex0", "loop.first", "loop.last", "loop.length", "loop.previtem",
         "loop.nextitem", "loop.depth", "loop.cycle(", "messages", "message", "role", "content",
         "add_generation_prompt", "bos_token", "eos_token", "tools", "tool_calls", "function", "arguments",
         "enable_thinking", "reasoning_content", "name", "safe", "trim", "length", "count", "tojson",
         "tojson(indent=2)", "upper", "lower", "title", "capitalize", "default(", "d(", "first", "last", "join(",
         "list", "string", "int", "float", "abs", "replace(", "reverse", "items", "items()", "selectattr(",
         "rejectattr(", "map(", "map(attribute=", "unique", "sort", "dictsort", "batch", "sum", "min", "max",
         "indent(", "wordcount", "center", ".strip()", ".lstrip(", ".rstrip(", ".upper()", ".lower()", ".title()",
         ".capitalize()", ".startswith(", ".endswith(", ".split(", ".replace(", ".find(", ".join(", ".items()",
         ".keys()", ".values()", ".get(", ".format(", ".append(", ".pop(", "defined", "undefined", "odd", "even",
         "divisibleby", "iterable", "mapping", "sequence", "number", "boolean", "sameas", "eq", "ne", "equalto",
         "integer", "'equalto'", "'user'", "'system'", "'assistant'", "attribute=", "maxsplit=", "default_value=",
         "%s", "__class__", "__init__", "__globals__", "mro"]


def write_dict(name, comment, entries):
    lines, seen = ["# " + c for c in comment], set()
    for e in entries:
        if e not in seen:
            seen.add(e)
            lines.append(dict_entry(e))
    with open(os.path.join(FUZZ, name), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def make_dicts():
    def json_dict(groups):
        out = list(JSON_SYNTAX)
        for g in groups:
            for k in JSON_KEYS[g]:
                out += [k, '"%s"' % k, '"%s":' % k]
        return out
    gen = "Generated by fuzz/make_corpus.py."
    write_dict("json.dict", ["JSON syntax and every field woq's JSON readers look for. " + gen],
               json_dict(JSON_KEYS.keys()))
    for g in JSON_KEYS:
        write_dict(g + ".dict", ["JSON syntax and the fields of the %s reader(s). %s" % (g, gen)], json_dict([g]))
    write_dict("jinja.dict", ["Jinja2 syntax, tags, filters, tests, methods and chat-template variables of",
                              "src/jinja; NUL separates the template from the JSON context. " + gen],
               ["\0"] + JINJA + json_dict(["openai"])[:40])


def main():
    for d in (CORPUS, DATA):
        if os.path.isdir(d):
            shutil.rmtree(d)
    make_safetensors()
    make_safetensors_index()
    make_configs()
    make_tokenizers()
    make_jinja()
    make_openai()
    make_gguf()
    make_dicts()


if __name__ == "__main__":
    main()
