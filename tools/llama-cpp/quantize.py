#!/usr/bin/env python3
"""Quantize a GGUF with llama.cpp's own quantizer (llama_model_quantize), no compile needed.

Usage: python3 tools/llama-cpp/quantize.py IN.gguf OUT.gguf TYPE [--threads N]
       TYPE: q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k, q8_0, q4_0, q4_1, q5_0, q5_1, f16

It loads the prebuilt libllama shipped in the npm package @node-llama-cpp/linux-x64 (installed
by `npm install --no-save` in this directory) with ctypes and calls llama_model_quantize exactly as
llama.cpp's `llama-quantize` tool does (default params, ftype set, allow_requantize on, so a
quantized input such as Q4_1 is dequantized and requantized). The library directory can be
overridden with LLAMA_CPP_LIB_DIR. Python standard library only.

The llama_model_quantize_params layout below is copied from include/llama.h of the exact
llama.cpp source node-llama-cpp 3.22.1 bundles (node_modules/node-llama-cpp/llama/
gitRelease.bundle, commit de3ff815ea7d, tag v0.5.0). It changes between llama.cpp versions
(this one has `dry_run` and `max_buf_size`), so the script checks the library's defaults look
like that header before using them.
"""
import argparse
import ctypes
import hashlib
import os
import struct
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB_DIR = os.path.join(HERE, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64")

# enum llama_ftype (include/llama.h)
FTYPES = {
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_s": 16,
    "q5_k_m": 17,
    "q6_k": 18,
}

# enum ggml_type (ggml/include/ggml.h), for the summary
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0", 42: "Q2_0",
}
GGML_TYPE_COUNT = 43
LLAMA_FTYPE_MOSTLY_Q8_0 = 7  # llama_model_quantize_default_params().ftype in this version
LLAMA_FTYPE_MOSTLY_Q5_1 = 9  # ... and in older ones


class QuantizeParams(ctypes.Structure):
    """struct llama_model_quantize_params (llama.cpp de3ff815ea7d, include/llama.h)."""

    _fields_ = [
        ("nthread", ctypes.c_int32),
        ("ftype", ctypes.c_int),  # enum llama_ftype
        ("output_tensor_type", ctypes.c_int),  # enum ggml_type
        ("token_embedding_type", ctypes.c_int),  # enum ggml_type
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.c_void_p),
        ("max_buf_size", ctypes.c_size_t),
    ]


def load_libllama(lib_dir):
    if not os.path.isdir(lib_dir):
        sys.exit(f"error: {lib_dir} not found; run `npm install --no-save` in {HERE} (or set LLAMA_CPP_LIB_DIR)")
    # libllama finds its ggml libraries through its $ORIGIN rpath; loading them first with
    # RTLD_GLOBAL also makes it work where LD_LIBRARY_PATH would otherwise be needed.
    for dep in ("libggml-base.so", "libggml.v0.5.0.so"):
        path = os.path.join(lib_dir, dep)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    names = sorted(n for n in os.listdir(lib_dir) if n.startswith("libllama.") and n.endswith(".so"))
    if not names:
        sys.exit(f"error: no libllama*.so in {lib_dir}")
    return ctypes.CDLL(os.path.join(lib_dir, names[0]), mode=ctypes.RTLD_GLOBAL), names[0]


def default_params(lib):
    """llama_model_quantize_default_params(), returned into a generously sized buffer.

    The struct is returned by value; it is larger than 16 bytes, so the x86-64 System V ABI
    passes a hidden pointer to the caller's buffer (in rdi) and returns it (in rax). Calling the
    function that way with a 0xAA-filled 1 KiB buffer shows exactly how many bytes the library
    writes, which must match the struct declared above.
    """
    f = lib.llama_model_quantize_default_params
    f.argtypes = [ctypes.c_void_p]
    f.restype = ctypes.c_void_p
    size = ctypes.sizeof(QuantizeParams)
    buf = (ctypes.c_uint8 * 1024)(*([0xAA] * 1024))
    if f(ctypes.addressof(buf)) != ctypes.addressof(buf):
        sys.exit("error: llama_model_quantize_default_params did not return its buffer (not x86-64 SysV?)")
    written = max((i + 1 for i in range(1024) if buf[i] != 0xAA), default=0)
    # the struct's padding bytes (22..23 after dry_run) may be left untouched
    if written > size or any(b != 0xAA for b in buf[size:]):
        sys.exit(f"error: llama_model_quantize_default_params wrote {written} bytes, the declared "
                 f"llama_model_quantize_params is {size}: llama.h layout mismatch")
    p = QuantizeParams.from_buffer_copy(bytes(buf[:size]))
    ok = (p.nthread == 0 and p.ftype in (LLAMA_FTYPE_MOSTLY_Q8_0, LLAMA_FTYPE_MOSTLY_Q5_1)
          and p.output_tensor_type == GGML_TYPE_COUNT
          and p.token_embedding_type == GGML_TYPE_COUNT and not p.allow_requantize
          and p.quantize_output_tensor and not p.only_copy and not p.pure and not p.keep_split
          and not p.dry_run and not p.imatrix and not p.kv_overrides and not p.tt_overrides
          and not p.prune_layers and p.max_buf_size < (1 << 40))
    if not ok:
        sys.exit("error: unexpected llama_model_quantize_default_params(): "
                 + ", ".join(f"{n}={getattr(p, n)}" for n, _ in QuantizeParams._fields_))
    return p


def gguf_tensor_types(path):
    """Minimal GGUF header reader: {tensor name: ggml type id}."""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8", "replace")

        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def skip(t):
            if t == 8:
                f.seek(rd("Q"), 1)
            elif t == 9:
                et, n = rd("I"), rd("Q")
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                f.seek(sizes[t], 1)

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        rd("I")
        n_tensors, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            rstr()
            skip(rd("I"))
        out = {}
        for _ in range(n_tensors):
            name = rstr()
            for _ in range(rd("I")):
                rd("Q")
            out[name] = rd("I")
            rd("Q")
        return out


def summary(path):
    types = gguf_tensor_types(path)
    c = Counter(GGML_TYPES.get(t, str(t)) for t in types.values())
    return len(types), ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv):
    ap = argparse.ArgumentParser(description="Quantize a GGUF with llama.cpp's llama_model_quantize.")
    ap.add_argument("input", metavar="IN")
    ap.add_argument("output", metavar="OUT")
    ap.add_argument("type", metavar="TYPE", type=str.lower, choices=sorted(FTYPES))
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores (llama.cpp default)")
    a = ap.parse_args(argv)
    src, dst, tname, threads = a.input, a.output, a.type, a.threads
    if not os.path.isfile(src):
        sys.exit(f"error: {src} not found")
    if os.path.abspath(src) == os.path.abspath(dst):
        sys.exit("error: IN and OUT are the same file")

    lib_dir = os.environ.get("LLAMA_CPP_LIB_DIR", DEFAULT_LIB_DIR)
    lib, libname = load_libllama(lib_dir)
    lib.llama_backend_init.argtypes = []
    lib.llama_backend_init.restype = None
    lib.llama_backend_init()
    lib.llama_print_system_info.restype = ctypes.c_char_p

    params = default_params(lib)
    params.ftype = FTYPES[tname]
    params.allow_requantize = True
    params.nthread = threads
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32

    n_in, types_in = summary(src)
    print(f"llama.cpp: {os.path.join(lib_dir, libname)} (node-llama-cpp 3.22.1 prebuilt, llama.cpp v0.5.0 / de3ff815ea7d)")
    print(f"input:  {src}\n        {n_in} tensors: {types_in}\n        sha256 {sha256(src)}")
    print(f"quantizing to {tname} (llama_ftype {params.ftype}), allow_requantize=true, "
          f"nthread={params.nthread or 'hardware_concurrency'}", flush=True)
    t0 = time.time()
    rc = lib.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    dt = time.time() - t0
    if rc != 0:
        sys.exit(f"error: llama_model_quantize returned {rc}")
    n_out, types_out = summary(dst)
    print(f"output: {dst} ({os.path.getsize(dst)} bytes, {dt:.1f} s)\n"
          f"        {n_out} tensors: {types_out}\n        sha256 {sha256(dst)}")


if __name__ == "__main__":
    main(sys.argv[1:])
