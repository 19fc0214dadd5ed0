#!/usr/bin/env python3
"""Writes expected_dequant.txt: the first 64 dequantized values of a few tensors of the default
model, as computed by the `gguf` PyPI package (pip install gguf; made with gguf 0.19.0).

Usage: python3 make_expected_dequant.py ../../../../models/SmolLM2-135M-Instruct.Q4_1.gguf
Each output line: tensor name, ggml type name, then 64 floats (shortest repr of the f32 value).
"""
import sys

import gguf
from gguf.quants import dequantize

TENSORS = ["blk.0.ffn_down.weight", "blk.7.attn_q.weight", "token_embd.weight", "blk.0.attn_norm.weight"]

reader = gguf.GGUFReader(sys.argv[1])
by_name = {t.name: t for t in reader.tensors}
with open("expected_dequant.txt", "w") as out:
    for name in TENSORS:
        t = by_name[name]
        values = dequantize(t.data, t.tensor_type).reshape(-1)[:64]
        out.write(" ".join([name, t.tensor_type.name] + [repr(float(v)) for v in values]) + "\n")
