"""The ground: the typed settings (`config`), the error tree (`errors`) and the rules every part shares (`cjk`: what
counts as a CJK character). Imports nothing of `rag` or `ingest`."""
