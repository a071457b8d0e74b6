"""The one place where errors become HTTP responses (and SSE `error` events).

Every body is OpenAI's error shape, which its SDKs and the clients built on them read:
`{"error": {"code", "message", "type", "param"}}` (and our `detail` where there is one); `type` follows
the status as OpenAI's API names it (OPENAI_TYPES).
"""

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
OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    499: "client_closed",
    503: "service_unavailable_error",
}


def openai_type(status: int) -> str:
    """OpenAI's error `type` for a status: its own names, `invalid_request_error` for other 4xx."""
    return OPENAI_TYPES.get(status) or ("invalid_request_error" if status < 500 else "server_error")


def _shaped(error: dict[str, Any], status: int) -> dict[str, Any]:
    return {"error": {**error, "type": error.get("type") or openai_type(status), "param": error.get("param")}}


def error_body(exc: Exception) -> dict[str, Any]:
    """The JSON body of an error; unexpected exceptions say nothing of their internals."""
    if isinstance(exc, RagError):
        return _shaped(exc.to_dict(), exc.status)
    return _shaped({"code": "internal_error", "message": "internal error; see the API log"}, 500)


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
        body = _shaped({"code": "invalid_request", "message": "; ".join(problems)}, 400)
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
        if exc.status_code in (404, 405):  # no such route (or method): our shape, not FastAPI's {"detail"}
            what = "route" if exc.status_code == 404 else "method for this route"
            code = "not_found" if exc.status_code == 404 else "method_not_allowed"
            message = f"no {what}: {request.method} {request.url.path[:200]} (the README lists the routes)"
            return JSONResponse(
                _shaped({"code": code, "message": message}, exc.status_code),
                status_code=exc.status_code,
                headers=getattr(exc, "headers", None),
            )
        return await http_exception_handler(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)
