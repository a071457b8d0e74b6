"""Where chunks live: Chroma (`chunks`), the BM25 index (`lexical`), the document catalog (`catalog`).
They may import only `rag.core`."""
