"""The HTTP API and the web page. On top: may import `rag.answering`, the stores, the clients, `ingest`."""
