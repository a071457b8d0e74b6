"""Servers of our own that run as separate processes: the embedding server. May import only `rag.core`."""
