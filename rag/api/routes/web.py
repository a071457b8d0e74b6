"""`GET /`: the chat page; `GET /static/{name}`: its scripts and styles. Nothing remote: it works offline.

The page itself needs no API key: the user types it into the page, which sends it on every /v1 call.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response

from rag.api.deps import SettingsDep
from rag.core.errors import NotFound

STATIC_DIR = Path(str(files("rag.api") / "static"))

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json; charset=utf-8",
}

# The page builds every node from text; this policy is the second wall: no inline or remote script,
# no remote image, style or connection, even if some markup slipped through.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",  # blob: the cited page, fetched with the key and shown by the page itself
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def static_file(name: str, folder: Path = STATIC_DIR) -> FileResponse:
    """One file of the flat static folder (or of its locales); no dot-files, no sub-paths, only known types."""
    path = folder / name
    if "/" in name or "\\" in name or name.startswith(".") or path.suffix not in MEDIA_TYPES or not path.is_file():
        raise NotFound(f"no static file {name!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.get("/")
def index(settings: SettingsDep) -> Response:
    """The page; with RAG_LANGUAGE set, it carries that language for a user who has chosen none."""
    if not settings.language:
        return static_file("index.html")
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    html = html.replace("<html ", f'<html data-default-language="{settings.language}" ', 1)
    return HTMLResponse(html, headers=HEADERS)


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    return static_file(name)


@router.get("/static/locales/{name}")
def locale(name: str) -> FileResponse:
    """The page's strings in one language (`en.json`, `zh-CN.json`)."""
    if not name.endswith(".json"):
        raise NotFound(f"no locale {name!r}")
    return static_file(name, STATIC_DIR / "locales")
