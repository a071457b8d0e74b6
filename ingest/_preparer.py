"""Loading and chunking, over the loaders and the chunker: the pipeline's default preparer."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from ingest._records import ChunkRecord, Prepared, SourceFile
from ingest.originals import PAGED_KINDS
from rag.core.config import Settings
from rag.core.errors import EmbedderUnavailable

# The chunk metadata keys of the contract with retrieval, from the names `Chunk.metadata()` uses.
_CONTRACT_KEYS = {"index": "chunk_index", "n_tokens": "tokens", "headings": "heading"}


def chunk_records(chunks: Iterable[Any], source: str) -> list[ChunkRecord]:
    """Chunks as the stores take them, with the metadata keys that retrieval reads."""
    return [
        ChunkRecord(
            chunk.id,
            chunk.text,
            {_CONTRACT_KEYS.get(k, k): v for k, v in chunk.metadata().items()} | {"source": source},
        )
        for chunk in chunks
        if chunk.text.strip()
    ]


class LoaderPreparer:
    """Loads a file with the loaders (which bound PDF, DOCX and big HTML parsing in a worker process) and
    cuts it with the chunker, counting tokens with the embedding model's tokenizer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._chunker: Any = None
        self._chunker_lock = threading.Lock()

    def __call__(self, data: bytes, file: SourceFile, doc_id: str) -> Prepared:
        from ingest.chunking import chunk_document
        from ingest.loaders.ocr import ocr_flags
        from ingest.loading import load_document

        doc = load_document(data, file.name, self.settings)
        records = chunk_records(chunk_document(doc, doc_id, self.chunker), file.name)
        for record in records:
            record.metadata.update(ocr_flags(doc, record.metadata, self.settings.ocr_min_confidence))
        return Prepared(records, doc.pages, doc.warnings, keep_original=doc.kind in PAGED_KINDS)

    @property
    def chunker(self) -> Any:
        with self._chunker_lock:
            if self._chunker is None:
                self._chunker = make_chunker(self.settings)
            return self._chunker

    def warm(self) -> None:
        """Build the chunker now (reading multilingual-e5-small's 250k-piece tokenizer takes about a CPU
        second), so that the first upload does not wait for it; a missing tokenizer is the upload's error."""
        with contextlib.suppress(EmbedderUnavailable):
            self.chunker  # noqa: B018


def make_chunker(settings: Settings) -> Any:
    """A chunker with the embedding model's own tokenizer (read from its files: no torch needed)."""
    import json

    from tokenizers import Tokenizer

    from ingest.chunking import Chunker

    model_dir = settings.embed_model_dir
    if not (model_dir / "tokenizer.json").is_file():
        raise EmbedderUnavailable(
            f"the embedding model {settings.embed_model} has no tokenizer at {model_dir}: "
            "run `rag models prepare` (it rebuilds multilingual-e5-small there) or set RAG_EMBED_MODEL_PATH"
        )
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = model_dir / "sentence_bert_config.json"
    max_sequence = json.loads(config.read_text()).get("max_seq_length") if config.exists() else None
    return Chunker.from_settings(settings, tokenizer, max_sequence)
