"""Errors of the stack, each carrying the HTTP status it maps to.

    RagError (500)
    ├── InvalidRequest (400)
    │   ├── QuestionTooLong (400)          the question alone exceeds the prompt budget
    │   ├── UnsupportedFileType (415)      the file's bytes are not a type we load
    │   ├── FileTooLarge (413)             an upload or a request body over its limit
    │   ├── TooManyInputs (413)            more embedding inputs than one request may carry
    │   ├── LimitExceeded (413)            a chat request over a RAG_MAX_* bound (messages, characters)
    │   ├── ModelNotForChat (400)          a chat request naming the embedding model (OpenAI's error shape)
    │   └── DocumentRejected (422)         a readable file with nothing to index (empty, scanned, encrypted)
    ├── Unauthorized (401)
    ├── Forbidden (403)                    a write from another site's page, or a Host this API does not serve
    ├── NotFound (404)
    │   └── ModelNotFound (404)            a model name this API does not serve (OpenAI's error shape)
    ├── Busy (429)                         the generation queue is full or waited too long
    ├── ClientClosed (499)                 the client went away before its answer was ready
    ├── StoreLocked (409)                  another process holds the embedded Chroma store
    ├── Conflict (409)                     another request is indexing or deleting this document
    │   ├── EmbedderMismatch (409)         the embedder is not the model that built the collection
    │   └── TooManyCollections (409)       a new collection past RAG_MAX_COLLECTIONS
    ├── UpstreamError (502)                a backend answered with something we cannot use
    │   ├── ContextOverflow (502)          llama-server's exceed_context_size_error
    │   └── PoolMismatch (502)             the servers of one pool serve different models or contexts
    ├── JobStalled (504)                   an upload job made no progress for RAG_JOB_STALL_S: its worker gave it up
    └── BackendUnavailable (503)          with Retry-After: a backend that is down or loading comes back
        ├── LLMUnavailable (503)           llama-server down or loading its model
        ├── EmbedderUnavailable (503)
        └── StoreUnavailable (503)
            ├── StoreDamaged (503)         without Retry-After: a damaged collection waits for `rag store repair`
            └── LeaseLost (503)            this replica's owner lease is another's (after a PostgreSQL restart)

The API maps them to JSON errors (and SSE `error` events mid-stream) in `rag/api/errors.py`, in OpenAI's
shape: `{"error": {"code", "message", "type", "param"}}`, `type` chosen by the status there.
"""

from __future__ import annotations

from typing import Any


class RagError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail:
            body["detail"] = self.detail
        return body


class InvalidRequest(RagError):
    status, code = 400, "invalid_request"


class QuestionTooLong(InvalidRequest):
    code = "question_too_long"


class UnsupportedFileType(InvalidRequest):
    status, code = 415, "unsupported_file_type"


class FileTooLarge(InvalidRequest):
    status, code = 413, "too_large"


class TooManyInputs(InvalidRequest):
    status, code = 413, "too_many_inputs"


class LimitExceeded(InvalidRequest):
    status, code = 413, "limit_exceeded"


class ModelNotForChat(InvalidRequest):
    code = "model_not_for_chat"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "param": "model"}


class DocumentRejected(InvalidRequest):
    status, code = 422, "document_rejected"


class Unauthorized(RagError):
    status, code = 401, "unauthorized"


class Forbidden(RagError):
    status, code = 403, "forbidden"


class NotFound(RagError):
    status, code = 404, "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"

    def to_dict(self) -> dict[str, Any]:
        # OpenAI's shape, which its SDKs and other clients read: type and param beside code and message.
        return {**super().to_dict(), "type": "invalid_request_error", "param": "model"}


class Busy(RagError):
    status, code = 429, "busy"

    def __init__(self, message: str, retry_after: int = 1, **detail: Any) -> None:
        super().__init__(message, retry_after=retry_after, **detail)
        self.retry_after = retry_after


class ClientClosed(RagError):
    # nginx's code for a client that closed the connection: nobody is left to read the reply.
    status, code = 499, "client_closed"


class StoreLocked(RagError):
    status, code = 409, "store_locked"


class Conflict(RagError):
    status, code = 409, "conflict"


class UpstreamError(RagError):
    status, code = 502, "upstream_error"


class ContextOverflow(UpstreamError):
    code = "exceed_context_size"

    def __init__(self, message: str, n_prompt_tokens: int | None = None, n_ctx: int | None = None) -> None:
        super().__init__(message, n_prompt_tokens=n_prompt_tokens, n_ctx=n_ctx)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class PoolMismatch(UpstreamError):
    code = "pool_mismatch"


class JobStalled(RagError):
    """An upload job whose progress stood still for RAG_JOB_STALL_S (a step hung): its worker stopped it."""

    status, code = 504, "job_stalled"


class BackendUnavailable(RagError):
    status, code = 503, "backend_unavailable"
    retry_after: int | None = (
        5  # seconds: a restart of llama-server or the embedder (rag up restarts them) takes about this
    )


class LLMUnavailable(BackendUnavailable):
    code = "llm_unavailable"


class EmbedderUnavailable(BackendUnavailable):
    code = "embedder_unavailable"


class StoreUnavailable(BackendUnavailable):
    code = "store_unavailable"


class EmbedderMismatch(Conflict):
    code = "embedder_mismatch"


class TooManyCollections(Conflict):
    code = "too_many_collections"


class StoreDamaged(StoreUnavailable):
    code = "store_damaged"
    retry_after = None  # it never clears by itself: a client should not retry, an operator must repair


class LeaseLost(StoreUnavailable):
    """This process's owner lease could not be taken again after PostgreSQL came back: another process holds
    it, or took its rows for a dead process's. The process works on no more rows under it; restart it."""

    code = "lease_lost"
    retry_after = 1  # another replica answers meanwhile


class BackupInvalid(InvalidRequest):
    """A backup folder that cannot be restored: a file missing or changed, another embedder, a newer schema."""

    code = "backup_invalid"


class StoreTooNew(Conflict):
    """A SQLite file of the store written by a newer version of this code."""

    code = "store_too_new"
