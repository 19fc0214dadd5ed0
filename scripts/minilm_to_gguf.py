#!/usr/bin/env python3
"""Converts a Hugging Face BertModel (model.safetensors, config.json, tokenizer.json,
1_Pooling/config.json: a sentence-transformers folder) to a GGUF file as llama.cpp's own converter
writes one (convert_hf_to_gguf.py, its BertModel class): the `bert` keys, the WordPiece vocabulary
in llama.cpp's phantom-space form, and the tensors under gguf-py's names, all in F32.

Usage: minilm_to_gguf.py SRC_DIR OUT.gguf NAME   (NAME: general.name)

Needs numpy and PyPI's `gguf` (the writer and the tensor-name map of llama.cpp's gguf-py);
scripts/fetch-minilm.sh runs it in a venv with both pinned. The output is deterministic: the same
inputs give the same bytes (fetch-minilm.sh checks the sha256).
"""
import json
import struct
import sys
from pathlib import Path

import gguf
import numpy as np


def read_safetensors(path):
    """Yields (name, array) for each tensor of a safetensors file, read through a memory map."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + header_len
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        yield name, np.frombuffer(data[base + start : base + end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: minilm_to_gguf.py SRC_DIR OUT.gguf NAME")
    src, out, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())

    w = gguf.GGUFWriter(out, "bert")
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    if pooling.get("pooling_mode_mean_tokens"):
        w.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        w.add_pooling_type(gguf.PoolingType.CLS)
    else:
        sys.exit(f"unsupported pooling in {src / '1_Pooling' / 'config.json'}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    # The vocabulary as llama.cpp's WPM tokenizer reads it: a word-start piece "x" becomes
    # "\u2581x", a continuation "##x" becomes "x", special tokens stay as they are.
    vocab = tok["model"]["vocab"]
    n_vocab = cfg["vocab_size"]
    by_id = {i: t for t, i in vocab.items()}
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    tokens, types = [], []
    for i in range(n_vocab):
        t = by_id[i]
        if i in special:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(t[2:] if t.startswith("##") else "\u2581" + t)
            types.append(gguf.TokenType.NORMAL)
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")  # llama.cpp's name for this uncased vocabulary; WPM ignores it
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(src, n_vocab=len(tokens)).add_to_gguf(w)
    normalizer = tok.get("normalizer") or {}
    if normalizer.get("type") == "BertNormalizer":
        w.add_bool("tokenizer.ggml.normalizer.lowercase", bool(normalizer.get("lowercase", True)))

    # The pooler is sentence-transformers' unused head; position_ids is a buffer, not a weight.
    skip = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    for name, array in read_safetensors(src / "model.safetensors"):
        if name in skip:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if not new:
            sys.exit(f"no GGUF name for tensor {name}")
        w.add_tensor(new, np.ascontiguousarray(array.astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
