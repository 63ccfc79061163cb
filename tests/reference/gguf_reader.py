"""An independent GGUF reader (NumPy), written from the GGUF specification
(ggml/docs/gguf.md) and ggml's block layouts (ggml-common.h), to check the
files woq writes.

    gguf_reader.py FILE.gguf OUT_DIR

Writes OUT_DIR/summary.json ({"version", "metadata": {key: value, arrays of
more than 64 elements as {"array": type, "count": n, "first": [...]}},
"tensors": [{"name", "type", "ne", "offset"}]}) and, for every tensor,
OUT_DIR/NAME.f32: its values dequantized to float32 in file order (row g of
ne[0] elements at g * ne[0]). Exits 77 when NumPy is missing.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(77)

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 8: "Q8_0", 30: "BF16"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.scalar("<Q")).decode("utf-8")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.scalar("<I"), self.scalar("<Q")
            items = [self.value(et) for _ in range(n)]
            if n > 64:
                return {"array": et, "count": n, "first": items[:8]}
            return items
        return self.scalar(SCALARS[t])


def dequantize(ttype, raw, n):
    if ttype == 0:
        return np.frombuffer(raw, dtype="<f4", count=n)
    if ttype == 1:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    if ttype == 30:
        bits = np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint32) << 16
        return bits.view(np.float32)
    if ttype == 2:  # Q4_0: fp16 d, 16 bytes; element i low nibble of qs[i], element i + 16 the high nibble
        blocks = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 18).reshape(-1, 18)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        qs = blocks[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) - 8
        return (q.astype(np.float32) * d).reshape(-1)
    if ttype == 8:  # Q8_0: fp16 d, 32 int8
        blocks = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 34).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    raise ValueError(f"type {ttype} not handled by this reader")


def bytes_of(ttype, n):
    return {0: 4 * n, 1: 2 * n, 30: 2 * n, 2: n // 32 * 18, 8: n // 32 * 34}[ttype]


def main():
    path, out = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise SystemExit("bad magic")
    version = r.scalar("<I")
    n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.scalar("<I"))
    alignment = metadata.get("general.alignment", 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
        ttype, offset = r.scalar("<I"), r.scalar("<Q")
        infos.append({"name": name, "type": TYPE_NAMES.get(ttype, str(ttype)), "type_id": ttype, "ne": ne, "offset": offset})
    start = (r.pos + alignment - 1) // alignment * alignment
    for t in infos:
        n = int(np.prod(t["ne"]))
        begin = start + t["offset"]
        raw = data[begin:begin + bytes_of(t["type_id"], n)]
        dequantize(t["type_id"], raw, n).astype("<f4").tofile(os.path.join(out, t["name"] + ".f32"))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"version": version, "metadata": metadata, "tensors": infos}, f)


if __name__ == "__main__":
    main()
