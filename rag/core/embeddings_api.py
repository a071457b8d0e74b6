"""The OpenAI embeddings API as the API's `/v1/embeddings`, the embedding server and the embedding client
all speak it: which inputs one request may carry (and which text any backend can encode), the response,
and a vector in either `encoding_format` (a list of floats, or base64 of little-endian float32)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from rag.core.errors import InvalidRequest, LimitExceeded, TooManyInputs

EncodingFormat = Literal["float", "base64"]
InputType = Literal["query", "passage"]  # our extension: which prompt a model with prompts puts in front
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_embedding_inputs(texts: Sequence[str], *, max_inputs: int, max_chars: int | None = None) -> None:
    """400 for no input, an empty one or text no backend can encode; 413 for more than `max_inputs` inputs
    or one over `max_chars` characters (None: no bound)."""
    if not texts:
        raise InvalidRequest("input must be a non-empty string or a list of non-empty strings")
    if len(texts) > max_inputs:
        raise TooManyInputs(
            f"{len(texts):,} inputs; at most {max_inputs:,} per request (RAG_EMBED_MAX_INPUTS)", limit=max_inputs
        )
    for index, text in enumerate(texts):
        if not text:
            raise InvalidRequest(f"input {index} is empty; every input must be a non-empty string")
        check_text(f"input {index}", text, max_chars)


def check_text(name: str, text: str, max_chars: int | None) -> None:
    """413 for a text over `max_chars` (RAG_MAX_MESSAGE_CHARS), 400 for one with a lone UTF-16 surrogate,
    which no backend can encode; `name` says which text it is."""
    if max_chars is not None and len(text) > max_chars:
        raise LimitExceeded(
            f"{name} has {len(text):,} characters; at most {max_chars:,} (RAG_MAX_MESSAGE_CHARS)", limit=max_chars
        )
    if _SURROGATE.search(text):
        raise InvalidRequest(f"{name} contains a lone UTF-16 surrogate (not valid Unicode text)")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    truncated_inputs: int = 0  # inputs longer than the model reads, embedded from their start


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


def embeddings_response(
    vectors: Iterable[npt.NDArray[np.float32]], encoding_format: EncodingFormat, model: str, usage: EmbeddingsUsage
) -> EmbeddingsResponse:
    data = [Embedding(index=i, embedding=encode_vector(v, encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingsResponse(data=data, model=model, usage=usage)


def encode_vector(vector: npt.NDArray[np.float32], encoding_format: EncodingFormat) -> list[float] | str:
    """A vector as the embeddings API sends it."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values


def decode_vector(embedding: list[float] | str) -> npt.NDArray[np.float32]:
    """A vector as the embeddings API sent it, in either encoding, as float32."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)
