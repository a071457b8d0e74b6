"""Thin clients of our own servers: llama-server (`llm`), the embedding server (`embedding`), the reranker
(`rerank`). They may import only `rag.core`."""
