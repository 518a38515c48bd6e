#!/usr/bin/env python3
"""Convert a sentence-transformers BERT model (safetensors) to an F16 GGUF file
that llama.cpp loads as arch "bert" (an embedding model).

A small, torch-free stand-in for llama.cpp's convert_hf_to_gguf.py (its
BertModel class): the same metadata, tensor names, tensor types and WordPiece
vocab transform, using only numpy and the `gguf` package (versions pinned in
scripts/embedding-requirements.txt). The safetensors file is parsed here
(8-byte header length, JSON header, raw little-endian buffer).

The output is deterministic: the same input files and the same pinned package
versions give the same bytes, so scripts/fetch-models.sh checks it by sha256.

Usage: convert-embedding-model.py MODEL_DIR OUTPUT.gguf [--name NAME]
  MODEL_DIR holds config.json, model.safetensors, tokenizer.json (and
  optionally vocab.txt, tokenizer_config.json, special_tokens_map.json,
  modules.json + the pooling module's config.json, README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - message for a missing venv
    sys.exit("convert-embedding-model: the 'gguf' package is missing; "
             "pip install -r scripts/embedding-requirements.txt")

# safetensors dtype -> numpy dtype (the format is always little-endian)
ST_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
    "BF16": "<u2",  # widened to float32 by hand below
}

# Tensors the embedding model does not use (as in llama.cpp's BertModel).
SKIP_EXACT = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
SKIP_PREFIXES = ("cls.predictions", "cls.seq_relationship")

# llama.cpp keeps these as F32 whatever the output type (convert_hf_to_gguf.py prepare_tensors).
F32_TENSORS = (gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES)

# The pre-tokenizer name llama.cpp's converter writes for the uncased BERT
# WordPiece tokenizer (BertNormalizer + BertPreTokenizer, bert-base-uncased
# vocab): its chkhsh 0876d13b... is listed twice there, "bert-bge" then
# "jina-v2-en", and the later one wins. llama.cpp ignores the pre-tokenizer for
# WPM vocabs; the name is written only to match the reference converter.
DEFAULT_TOKENIZER_PRE = "jina-v2-en"


def die(msg: str) -> None:
    sys.exit(f"convert-embedding-model: error: {msg}")


def read_json(path: Path) -> dict | list:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> float32/float16 (or integer) array, native byte order."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        die(f"{path}: too short for a safetensors file")
    (n_header,) = struct.unpack("<Q", raw[:8])
    if n_header > len(raw) - 8:
        die(f"{path}: header length {n_header} exceeds the file")
    header = json.loads(raw[8:8 + n_header].decode("utf-8"))
    buf = memoryview(raw)[8 + n_header:]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in ST_DTYPES:
            die(f"{path}: tensor {name}: unsupported dtype {dtype}")
        shape = [int(d) for d in info["shape"]]
        start, end = (int(x) for x in info["data_offsets"])
        np_dtype = np.dtype(ST_DTYPES[dtype])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= start <= end <= len(buf)) or end - start != count * np_dtype.itemsize:
            die(f"{path}: tensor {name}: bad data_offsets {start}..{end} for {dtype}{shape}")
        arr = np.frombuffer(buf[start:end], dtype=np_dtype).reshape(shape)
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.astype(arr.dtype.newbyteorder("="), copy=False)
    return out


def block_id(name: str) -> int | None:
    for part in name.split("."):
        if part.isdecimal():
            return int(part)
    return None


def convert_tensors(tensors: dict[str, np.ndarray], n_layers: int) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    f32_names = {gguf.TENSOR_NAMES[t] for t in F32_TENSORS}  # model-wide tensors, no block id
    converted = []
    seen: set[str] = set()
    for hf_name, data in tensors.items():
        name = hf_name[5:] if hf_name.startswith("bert.") else hf_name
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        if name in SKIP_EXACT or name.startswith(SKIP_PREFIXES):
            continue
        new_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            die(f"cannot map tensor {hf_name!r} to a GGUF name")
        if new_name in seen:
            die(f"two tensors map to {new_name}")
        seen.add(new_name)
        if data.dtype not in (np.float16, np.float32):
            data = data.astype(np.float32)
        if data.ndim <= 1 or new_name.endswith("_norm.weight") \
                or new_name.rsplit(".", 1)[0] in f32_names or not new_name.endswith(".weight"):
            qtype = gguf.GGMLQuantizationType.F32
            data = data.astype(np.float32)
        else:
            qtype = gguf.GGMLQuantizationType.F16
            data = data.astype(np.float16)
        converted.append((new_name, np.ascontiguousarray(data), qtype))
    # A fixed order: the model-wide tensors, then block 0, 1, ...; by name within each.
    converted.sort(key=lambda t: (-1 if block_id(t[0]) is None else block_id(t[0]), t[0]))
    return converted


def load_vocab(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int], dict]:
    """Tokens and token types as llama.cpp's get_vocab_base() + BertModel.set_vocab() make them."""
    tok = read_json(model_dir / "tokenizer.json")
    model = tok.get("model", {})
    if model.get("type") != "WordPiece":
        die(f"tokenizer.json: model type {model.get('type')!r}, expected WordPiece")
    if model.get("continuing_subword_prefix", "##") != "##":
        die("tokenizer.json: only the '##' continuing-subword prefix is supported")
    normalizer = tok.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        die(f"tokenizer.json: normalizer {normalizer.get('type')!r}, expected BertNormalizer")
    if (tok.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        die("tokenizer.json: pre_tokenizer is not BertPreTokenizer")

    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["content"]: a for a in tok.get("added_tokens", [])}
    for content, a in added.items():
        vocab.setdefault(content, a["id"])
    if max(vocab.values()) >= vocab_size:
        die(f"token id {max(vocab.values())} >= vocab_size {vocab_size}")

    vocab_txt = model_dir / "vocab.txt"
    if vocab_txt.is_file():
        with open(vocab_txt, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f]
        if {t: i for i, t in enumerate(lines)} != dict(model["vocab"]):
            die("vocab.txt and tokenizer.json disagree")

    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            # llama.cpp round-trips non-normalized added tokens through the HF
            # tokenizer; for BERT's [PAD]/[UNK]/[CLS]/[SEP]/[MASK] that is the identity.
            if added[token].get("special") or (token.startswith("<|") and token.endswith("|>")):
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        tokens.append(token)

    # phantom-space vocab: "##piece" -> "piece", "word" -> "\u2581word", control tokens as they are
    def phantom(tok: str, toktype: int) -> str:
        if toktype == gguf.TokenType.CONTROL:
            return tok
        if tok.startswith("##"):
            return tok[2:]
        return "\u2581" + tok

    tokens = [phantom(t, tt) for t, tt in zip(tokens, toktypes)]
    if len(set(tokens)) != len(tokens):
        die("the phantom-space transform made duplicate tokens")
    if any(t == "" for t in tokens):
        die("the phantom-space transform made an empty token")
    return tokens, toktypes, normalizer


def pooling_type(model_dir: Path) -> gguf.PoolingType | None:
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    for mod in read_json(modules):
        if mod.get("type") == "sentence_transformers.models.Pooling":
            cfg = read_json(model_dir / mod["path"] / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            if cfg.get("pooling_mode_lasttoken"):
                return gguf.PoolingType.LAST
            die("only MEAN, CLS and LAST pooling are supported")
    return None


def model_card_license(model_dir: Path) -> str | None:
    readme = model_dir / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---", 4)
    if end < 0:
        return None
    import yaml  # a dependency of gguf

    card = yaml.safe_load(text[4:end]) or {}
    lic = card.get("license")
    return lic if isinstance(lic, str) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument("--name", help="general.name (default: OUTPUT's file name up to the first '.')")
    args = ap.parse_args()
    model_dir: Path = args.model_dir
    name = args.name or args.output.name.split(".")[0]

    hp = read_json(model_dir / "config.json")
    archs = hp.get("architectures") or []
    if hp.get("model_type") != "bert" and "BertModel" not in archs:
        die(f"config.json: not a BERT model (model_type {hp.get('model_type')!r}, architectures {archs})")
    if hp.get("position_embedding_type", "absolute") != "absolute":
        die("only absolute position embeddings are supported")
    if hp.get("hidden_act", "gelu") != "gelu":
        die(f"hidden_act {hp.get('hidden_act')!r}: llama.cpp's bert graph uses gelu")
    n_layers = int(hp["num_hidden_layers"])
    vocab_size = int(hp["vocab_size"])

    tensors = convert_tensors(read_safetensors(model_dir / "model.safetensors"), n_layers)
    tokens, toktypes, normalizer = load_vocab(model_dir, vocab_size)
    tok_embd = next(t for n, t, _ in tensors if n == "token_embd.weight")
    if tok_embd.shape[0] != len(tokens):
        die(f"token_embd has {tok_embd.shape[0]} rows, the vocab {len(tokens)} tokens")

    out: Path = args.output
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    for tname, data, qtype in tensors:
        writer.add_tensor(tname, data, raw_dtype=qtype)

    # general.* (what gguf.Metadata would set from this model's files)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_basename(name)
    writer.add_size_label(gguf.size_label(*writer.get_total_parameter_count()))
    if (lic := model_card_license(model_dir)) is not None:
        writer.add_license(lic)

    # hyperparameters (TextModel.set_gguf_parameters + BertModel.set_gguf_parameters)
    writer.add_block_count(n_layers)
    writer.add_context_length(int(hp["max_position_embeddings"]))
    writer.add_embedding_length(int(hp["hidden_size"]))
    writer.add_feed_forward_length(int(hp["intermediate_size"]))
    writer.add_head_count(int(hp["num_attention_heads"]))
    writer.add_layer_norm_eps(float(hp["layer_norm_eps"]))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_causal_attention(False)
    if (pool := pooling_type(model_dir)) is not None:
        writer.add_pooling_type(pool)

    # vocab (BertModel.set_vocab)
    writer.add_token_type_count(int(hp.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(DEFAULT_TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(toktypes)
    # BertNormalizer options, read by llama.cpp's WPM tokenizer (absent = uncased).
    lowercase = bool(normalizer.get("lowercase", True))
    strip_accents = normalizer.get("strip_accents")
    # (gguf 0.19 has no helper for these keys; the names are llama.cpp's llama-arch.cpp.)
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    writer.add_bool("tokenizer.ggml.normalizer.strip_accents",
                    lowercase if strip_accents is None else bool(strip_accents))
    # special token ids and add_bos/add_eos/add_sep, from tokenizer.json + tokenizer_config.json
    special = gguf.SpecialVocab(model_dir, n_vocab=len(tokens))
    # gguf has no key for CLS: llama.cpp's WPM tokenizer starts with the BOS id.
    cls_id = special.special_token_ids.pop("cls", None)
    if cls_id is not None and cls_id != special.special_token_ids.get("bos"):
        die(f"CLS token id {cls_id} differs from the BOS token id {special.special_token_ids.get('bos')}")
    special.add_to_gguf(writer, quiet=True)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"convert-embedding-model: wrote {out} ({out.stat().st_size} bytes, "
          f"{len(tensors)} tensors, {len(tokens)} tokens)")


if __name__ == "__main__":
    main()
