"""`GET /health`: the state of each backend; 503 until all are ready.

It needs no key (a container's health check has none), so the names of damaged collections are shown to
whom may open them alone: every one to the admin, its own to a scoped key, none without a key.

It answers at once, whatever a backend does: each backend is probed in the background (a probe when its
last state is older than PROBE_EVERY_S, within RAG_PROBE_TIMEOUT_S: a server that accepts the connection
and never answers is `down` then), and a request waits at most ANSWER_WITHIN_S for those probes before
it reports the last states."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from rag.answering.prompt import choose_style
from rag.api.access import Access, authorize
from rag.api.deps import ServicesDep
from rag.core.errors import BackendUnavailable, RagError, Unauthorized
from rag.store.chroma_vectors import REPAIR_HINT

router = APIRouter()

PROBE_EVERY_S = 1.0
ANSWER_WITHIN_S = 0.3


def _shown(description: str) -> Any:
    """A field left out of the body when it is None (the backend did not say)."""
    return Field(default=None, exclude_if=lambda v: v is None, description=description)


class LLMState(BaseModel):
    """The generator (a llama-server or a pool of them); its model and slots once it answers."""

    model_config = ConfigDict(extra="allow")
    state: str = Field(description="ok, loading, down, or refused (a pool member unlike the others)")
    url: str
    reason: Annotated[str | None, _shown("Why it is not ok.")]
    servers: Annotated[list[dict[str, Any]] | None, _shown("A pool's members, one by one.")]
    model: Annotated[str | None, _shown("The model llama-server serves.")]
    n_ctx: Annotated[int | None, _shown("Tokens of context per slot.")]
    slots: Annotated[int | None, _shown("Generation slots.")]
    prompt_style: Annotated[str | None, _shown("The chat template the prompts are written for.")]
    warning: Annotated[str | None, _shown("A doubt about that prompt style.")]


class EmbedderState(BaseModel):
    """The embedding server (or pool), with the fields its own /health gives (`model`, `dimensions`...)."""

    model_config = ConfigDict(extra="allow")
    state: str = Field(description="ok, loading or down")
    url: str
    reason: Annotated[str | None, _shown("Why it is not ok.")]


class StoreState(BaseModel):
    """Chroma and the data directory; `damaged` names the collections the caller may open that need a repair."""

    state: Literal["ok", "down", "damaged"]
    mode: str
    location: str
    data_dir: str
    problems: Annotated[dict[str, str] | None, _shown("Per damaged collection (`*`: Chroma itself), why.")]
    fix: Annotated[str | None, _shown("The command that repairs it.")]


class Backends(BaseModel):
    llm: LLMState
    embedder: EmbedderState
    store: StoreState


class Health(BaseModel):
    """ok (200), degraded (200: up, some collections damaged), loading or down (503, with Retry-After)."""

    status: Literal["ok", "degraded", "loading", "down"]
    backends: Backends


async def _llm_state(services: ServicesDep) -> dict[str, Any]:
    health = await services.llm.health()
    state: dict[str, Any] = {"state": health.state, "url": services.llm.base_url}
    if health.reason:
        state["reason"] = health.reason
    if servers := services.llm.describe():
        state["servers"] = servers
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


def _store_state(services: ServicesDep, caller: Access | None, alive: bool) -> StoreState:
    store = services.store
    settings = services.settings
    mode: str = settings.chroma_mode
    where = settings.chroma_url if mode == "server" else str(settings.chroma_path)
    if settings.vector_store == "pgvector" and settings.database_url:
        from rag.store.postgres import shown_url

        mode, where = "pgvector", shown_url(settings.database_url)
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
    return StoreState.model_validate(state)


def _caller(request: Request, services: ServicesDep) -> Access | None:
    """Who asks, if the request carries a key (None without one, or with a wrong one)."""
    try:
        return authorize(request.headers.get("authorization", ""), services.settings, services.key_store())
    except Unauthorized:
        return None


class LastState:
    """One backend's last probed state; `refresh()` probes it again in the background when that is old."""

    def __init__(self, probe: Callable[[], Awaitable[dict[str, Any]]], budget_s: float | None, url: str) -> None:
        self.probe = probe
        self.budget_s = budget_s  # None: the probe is not given up (a thread cannot be stopped)
        self.url = url
        self.state: dict[str, Any] = {"state": "loading", "reason": "not probed yet", "url": url}
        self.probed_at: float | None = None
        self._running: asyncio.Task[None] | None = None

    def refresh(self) -> asyncio.Task[None] | None:
        """The probe under way: started now when the last one is older than PROBE_EVERY_S; None if fresh."""
        fresh = self.probed_at is not None and time.monotonic() - self.probed_at < PROBE_EVERY_S
        if self._running is None and not fresh:
            self._running = asyncio.ensure_future(self._probe())
        return self._running

    async def _probe(self) -> None:
        try:
            async with asyncio.timeout(self.budget_s):
                self.state = await self.probe()
        except TimeoutError:
            self.state = {"state": "down", "reason": f"no answer within {self.budget_s:g} s", "url": self.url}
        finally:
            self.probed_at, self._running = time.monotonic(), None


class BackendStates:
    """The last probed state of the llm, the embedder and the store, for `/health` (one per app)."""

    def __init__(self, services: ServicesDep) -> None:
        # A pool probes each member within RAG_PROBE_TIMEOUT_S: a second more, and it reports them one by one.
        budget = services.settings.probe_timeout_s + 1.0
        self.llm = LastState(lambda: _llm_state(services), budget, services.llm.base_url)
        self.embedder = LastState(lambda: _embedder_state(services), budget, services.embedder.base_url)
        self.store = LastState(lambda: _store_alive(services), None, "")

    async def current(self, wait_s: float) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """The llm's and the embedder's states and whether the store answers, probed again where they are
        old (waiting up to `wait_s` for those probes)."""
        running = [t for t in (s.refresh() for s in (self.llm, self.embedder, self.store)) if t is not None]
        if running:
            await asyncio.wait(running, timeout=wait_s)
        return self.llm.state, self.embedder.state, bool(self.store.state.get("alive"))


async def _store_alive(services: ServicesDep) -> dict[str, Any]:
    return {"alive": await asyncio.to_thread(services.store.heartbeat)}


async def start_probing(app: FastAPI, services: ServicesDep) -> None:
    """At start-up: the first probes of every backend (up to RAG_PROBE_TIMEOUT_S), so /health has states."""
    app.state.backend_states = BackendStates(services)
    await app.state.backend_states.current(wait_s=services.settings.probe_timeout_s)


@router.get(
    "/health", responses={503: {"model": Health, "description": "A backend is loading or down (with Retry-After)."}}
)
async def health(request: Request, response: Response, services: ServicesDep) -> Health:
    caller = _caller(request, services)
    probes = getattr(request.app.state, "backend_states", None)
    if probes is None:  # an app whose start-up did not probe
        probes = request.app.state.backend_states = BackendStates(services)
    llm, embedder, alive = await probes.current(wait_s=ANSWER_WITHIN_S)
    backends = Backends(
        llm=LLMState.model_validate(llm),
        embedder=EmbedderState.model_validate(embedder),
        store=_store_state(services, caller, alive),
    )
    states = {backends.llm.state, backends.embedder.state, backends.store.state}
    if states == {"ok", "damaged"}:
        # Up, and it stays so: the damage is reported, not waited for (a repair needs the API stopped).
        return Health(status="degraded", backends=backends)
    if states == {"ok"}:
        return Health(status="ok", backends=backends)
    response.status_code = 503
    response.headers["Retry-After"] = str(BackendUnavailable.retry_after)
    return Health(status="loading" if "down" not in states else "down", backends=backends)
