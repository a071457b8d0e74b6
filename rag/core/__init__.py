"""The ground: the typed settings (`config`) and the error tree (`errors`). Imports nothing of `rag` or `ingest`."""
