#!/usr/bin/env python3
"""Keep the first HEADS heads, and optionally the first LAYERS layers, of a MiniLM capture
(q/k/v/o `[1, s, h, d]`, lse `[1, h, s]`, tensors named `layer<i>.<name>`).

Attention is per head, so the kept heads' stored float64-computed references stay exact: the
cut file is the same independent check as the original, on fewer heads. The originals (12
heads each, 2.5 MB and 6.5 MB) are in git history before this script's commit.

    python3 data/slice_heads.py IN OUT HEADS [LAYERS]
"""
import json
import struct
import sys

SIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def main(src, dst, keep, layers=None):
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    meta = header.pop("__metadata__", {})
    heads = int(meta["num_heads"])
    out, blobs, off = {}, [], 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if layers is not None and int(name.split(".")[0][len("layer"):]) >= layers:
            continue
        a, b = t["data_offsets"]
        data, shape = body[a:b], list(t["shape"])
        axis = 1 if name.split(".")[-1].startswith("lse") else 2
        assert shape[axis] == heads, (name, shape)
        # Row-major: `outer` blocks of [heads, inner]; keep the first `keep` heads of each.
        outer = 1
        for s in shape[:axis]:
            outer *= s
        inner = SIZE[t["dtype"]]
        for s in shape[axis + 1 :]:
            inner *= s
        cut = b"".join(data[i * heads * inner : (i * heads + keep) * inner] for i in range(outer))
        shape[axis] = keep
        out[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + len(cut)]}
        blobs.append(cut)
        off += len(cut)
    meta["num_heads"] = str(keep)
    meta["heads_kept"] = f"the first {keep} of the model's {heads} heads (data/slice_heads.py)"
    if layers is not None:
        meta["layers_kept"] = f"the first {layers} of the model's {meta['num_layers']} layers"
        meta["num_layers"] = str(layers)
    head = json.dumps({"__metadata__": meta, **out}, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
