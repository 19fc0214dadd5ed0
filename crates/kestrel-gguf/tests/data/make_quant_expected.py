#!/usr/bin/env python3
"""Writes quant_expected.bin: expected (de)quantization results for the formats Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, as computed by the `gguf` PyPI package's numpy code
(gguf/quants.py; made with gguf 0.19.0 and numpy 2). tests/quant_expected.rs reads the file;
the Python package is never needed at test time.

Rerun (from this directory):
    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0
    /tmp/gguf-venv/bin/python make_quant_expected.py
The output is deterministic (fixed seed), so a rerun reproduces the committed file.

Two kinds of cases, for each type:
  - random block bytes (f16 scale fields set to valid f16 values of assorted magnitudes and
    signs, zero and subnormal included; every other byte random) with gguf's dequantization;
  - for types gguf can quantize (Q5_0, Q5_1): float rows (random, a zero block, constant
    blocks, large and tiny magnitudes, negative-only blocks, values on rounding ties), gguf's
    quantized bytes and their dequantization. gguf 0.19.0 has no K-quant quantizer, so K-quant
    quantization is tested by properties instead (see tests/quant_expected.rs).

File format, little-endian, a sequence of records:
    u8 name length, type name (ASCII, e.g. "Q4_K"), u8 kind, u32 element count n, then
    kind 0: block bytes, f32[n] dequantized
    kind 1: f32[n] input, block bytes (gguf's quantization), f32[n] dequantized
"""
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

SEED = 20240601
OUT = "quant_expected.bin"

# Byte offsets of the f16 fields (d, dmin/m) in each block (ggml-common.h's block structs).
F16_FIELDS = {
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANTIZABLE = [T.Q5_0, T.Q5_1]
RANDOM_BLOCKS = {T.Q5_0: 64, T.Q5_1: 64, T.Q2_K: 8, T.Q3_K: 8, T.Q4_K: 8, T.Q5_K: 8, T.Q6_K: 8}

rng = np.random.default_rng(SEED)


def random_blocks(qtype, n_blocks):
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for b in range(n_blocks):
        for k, off in enumerate(F16_FIELDS[qtype]):
            if b == 0:
                value = 0.0  # a zero scale
            elif b == 1:
                value = 6.0e-8 * (k + 1)  # f16 subnormals
            else:
                value = rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-4.0, 0.5)
            blocks[b, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return blocks


def float_rows():
    """Blocks of 32 values, one row of 2048: each block of a different kind."""
    blocks = []
    for i in range(64):
        kind = i % 8
        if kind == 0:
            b = rng.standard_normal(32)
        elif kind == 1:
            b = np.zeros(32)
        elif kind == 2:
            b = np.full(32, rng.choice([-0.75, 0.3, 2.5]))
        elif kind == 3:
            b = rng.standard_normal(32) * 1.0e4  # f16 tops out at 65504
        elif kind == 4:
            b = rng.standard_normal(32) * 1.0e-6
        elif kind == 5:
            b = -np.abs(rng.standard_normal(32)) - 0.1
        elif kind == 6:
            # Multiples of 1/16 of the extreme: many values land exactly on rounding ties.
            b = rng.integers(-32, 33, size=32) / 2.0
            b[0] = 16.0
        else:
            b = rng.uniform(0.0, 1.0, 32) * 10.0 ** rng.uniform(-3, 3)
        blocks.append(b)
    return np.concatenate(blocks).astype(np.float32)


def record(out, qtype, kind, n, *parts):
    name = qtype.name.encode()
    out.write(struct.pack("<B", len(name)) + name + struct.pack("<BI", kind, n))
    for p in parts:
        out.write(np.ascontiguousarray(p).tobytes())


with open(OUT, "wb") as out:
    for qtype, n_blocks in RANDOM_BLOCKS.items():
        block_size, _ = GGML_QUANT_SIZES[qtype]
        blocks = random_blocks(qtype, n_blocks)
        values = dequantize(blocks.reshape(-1), qtype).astype(np.float32, copy=False)
        record(out, qtype, 0, n_blocks * block_size, blocks, values)
    for qtype in QUANTIZABLE:
        x = float_rows()
        q = quantize(x.reshape(1, -1), qtype).reshape(-1)
        values = dequantize(q, qtype).astype(np.float32, copy=False).reshape(-1)
        record(out, qtype, 1, x.size, x, q, values)
