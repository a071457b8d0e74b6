"""Ingestion: files loaded (`loading`, `detect`, the parser workers of `sandbox` and the OCR workers of
`ocr_pool`, both over `worker_processes`, the OCR's messages in `ocr_messages`), cut into chunks
(`chunking`), embedded and stored (`pipeline`, run by its private `_run` over `_stores`, `_preparer`,
`_records`...), upload jobs (`jobs`, and `job_queue` in PostgreSQL), folders watched (`watch`).
It may import only `rag.core`, `rag.clients` and `rag.store`; `ingest.loaders` only `rag.core` and, of
ingest, the data (`models`) and the format checks (`detect`). A leading `_` marks a module that only the
pipeline and its other private modules import (in `loaders`, the loaders)."""
