"""Question to answer: retrieval, the prompt and its token budget, the generation gate, the answering
core, citations. May import `rag.core`, `rag.clients` and `rag.store`; never `ingest`, the API or `deploy`."""
