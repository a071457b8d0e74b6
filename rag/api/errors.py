"""The one place where errors become HTTP responses (and SSE `error` events)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY

from rag.core.errors import FileTooLarge, InvalidRequest, RagError

log = logging.getLogger("rag.api")
MAX_PROBLEMS = 10  # validation problems listed in one error message


def error_body(exc: Exception) -> dict[str, Any]:
    """The JSON body of an error; unexpected exceptions say nothing of their internals."""
    if isinstance(exc, RagError):
        return {"error": exc.to_dict()}
    return {"error": {"code": "internal_error", "message": "internal error; see the API log"}}


def error_response(exc: Exception) -> JSONResponse:
    status = exc.status if isinstance(exc, RagError) else 500
    # Busy (429) and BackendUnavailable (503) clear by themselves: say when to try again.
    retry_after = getattr(exc, "retry_after", None) if isinstance(exc, RagError) else None
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if isinstance(exc, FileTooLarge):
        # The body is refused mid-stream: close rather than drain the rest of it to keep the connection.
        headers["Connection"] = "close"
    if status >= 500 and not isinstance(exc, RagError):
        log.exception("unhandled error", exc_info=exc)
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RagError)
    async def _rag_error(request: Request, exc: RagError) -> JSONResponse:
        access = getattr(request.state, "access", None)  # set by rag.api.deps.get_access
        return error_response(access.hidden(exc) if access is not None else exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # The first few problems only: a body of a million wrong items must not come back a million times.
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"and {len(errors) - MAX_PROBLEMS:,} more")
        body = {"error": {"code": "invalid_request", "message": "; ".join(problems)}}
        return JSONResponse(body, status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Any:
        if exc.status_code == 413:  # starlette's body limit on the chat routes
            limit = request.scope.get(MAX_BODY_SIZE_SCOPE_KEY)
            shown = f"the limit of {limit:,} bytes" if isinstance(limit, int) else "its limit"
            return error_response(
                FileTooLarge(f"the request body is over {shown} (RAG_MAX_REQUEST_BYTES)", limit=limit)
            )
        if exc.status_code == 400:  # FastAPI's body parser: not UTF-8, or JSON nested too deeply for Python
            return error_response(InvalidRequest(f"the request body could not be parsed as JSON: {exc.detail}"))
        return await http_exception_handler(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)
