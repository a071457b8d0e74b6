"""What the MCP tools answer: typed, so each tool declares its output schema to the client."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rag.answering.events import CitationEntry, SourceEntry


class SearchHit(BaseModel):
    chunk_id: str
    doc_id: str
    document: str = Field(description="the document's name")
    page: int | None = None
    heading: str | None = None
    score: float = Field(description="fused hybrid score, 0-1 (the reranker's when one runs)")
    text: str


class SearchResult(BaseModel):
    query: str = Field(description="the query actually searched")
    collection: str
    results: list[SearchHit]


class AskResult(BaseModel):
    answer: str
    collection: str
    query: str = Field(description="the query actually searched (a follow-up is rewritten with its history)")
    rewrite: str = Field(description="how the query was made from the question: off, rule or generator")
    sources: list[SourceEntry] = Field(description="the sources in the prompt, as /v1/chat lists them")
    citations: list[CitationEntry] = Field(
        description="the model's own [Sn] citations (kind: model) and the sources attributed to its sentences "
        "(kind: attributed, with support)"
    )
    unsupported_sentences: int = Field(0, description="answer sentences no source supports")
    no_sources: str | None = Field(None, description="why the fixed 'not in the documents' answer was given")


class DocumentEntry(BaseModel):
    id: str
    name: str
    collection: str
    state: str
    chunks: int
    pages: int | None = None
    uri: str = Field(description="the resource holding the document's text")


class DocumentList(BaseModel):
    collection: str
    total: int
    documents: list[DocumentEntry]


class CollectionEntry(BaseModel):
    name: str
    documents: int = Field(description="indexed documents")


class CollectionList(BaseModel):
    collections: list[CollectionEntry]


def document_uri(collection: str, doc_id: str) -> str:
    return f"rag://{collection}/documents/{doc_id}"
