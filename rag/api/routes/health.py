"""`GET /health`: the state of each backend; 503 until all are ready.

It needs no key (a container's health check has none), so the names of damaged collections are shown to
whom may open them alone: every one to the admin, its own to a scoped key, none without a key."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rag.answering.prompt import choose_style
from rag.api.access import Access, authorize
from rag.api.deps import ServicesDep
from rag.core.errors import BackendUnavailable, RagError, Unauthorized
from rag.store.chunks import REPAIR_HINT

router = APIRouter()


async def _llm_state(services: ServicesDep) -> dict[str, Any]:
    health = await services.llm.health()
    state: dict[str, Any] = {"state": health.state, "url": services.llm.base_url}
    if health.reason:
        state["reason"] = health.reason
    if health.state == "ok":
        try:
            props = await services.llm.props()
        except RagError as exc:
            return {**state, "state": "down", "reason": exc.message}
        state.update(model=props.model, n_ctx=props.n_ctx, slots=props.total_slots)
        settings = services.settings
        style = choose_style(settings.llm_prompt_style, [settings.llm_model_path, props.model_path])
        state["prompt_style"] = style.name
        if style.warning:
            state["warning"] = style.warning
    return state


async def _embedder_state(services: ServicesDep) -> dict[str, Any]:
    return {**await services.embedder.health(), "url": services.embedder.base_url}


async def _store_state(services: ServicesDep, caller: Access | None) -> dict[str, Any]:
    store = services.store
    alive = await asyncio.to_thread(store.heartbeat)
    mode = services.settings.chroma_mode
    where = services.settings.chroma_url if mode == "server" else str(services.settings.chroma_path)
    state: dict[str, Any] = {
        "state": "ok" if alive else "down",
        "mode": mode,
        "location": where,
        "data_dir": str(services.settings.data_dir),
    }
    every = {**store.out_of_step, **store.damaged}
    problems = {name: why for name, why in every.items() if caller is not None and caller.allows(name)}
    if store.unreadable:
        problems["*"] = store.unreadable
    if every or problems:
        # The API serves the healthy collections meanwhile; the damaged ones answer 503 with this fix.
        state.update(state="damaged", problems=problems, fix=f"{REPAIR_HINT}")
    return state


def _caller(request: Request, services: ServicesDep) -> Access | None:
    """Who asks, if the request carries a key (None without one, or with a wrong one)."""
    try:
        return authorize(request.headers.get("authorization", ""), services.settings, services.key_store())
    except Unauthorized:
        return None


@router.get("/health")
async def health(request: Request, services: ServicesDep) -> JSONResponse:
    caller = _caller(request, services)
    llm, embedder, store = await asyncio.gather(
        _llm_state(services), _embedder_state(services), _store_state(services, caller)
    )
    backends = {"llm": llm, "embedder": embedder, "store": store}
    states = {b["state"] for b in backends.values()}
    if states == {"ok", "damaged"}:
        # Up, and it stays so: the damage is reported, not waited for (a repair needs the API stopped).
        return JSONResponse({"status": "degraded", "backends": backends}, status_code=200)
    overall = "ok" if states == {"ok"} else ("loading" if "down" not in states else "down")
    if overall == "ok":
        return JSONResponse({"status": overall, "backends": backends})
    retry = {"Retry-After": str(BackendUnavailable.retry_after)}
    return JSONResponse({"status": overall, "backends": backends}, status_code=503, headers=retry)
