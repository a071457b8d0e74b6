"""How a pool of servers judges each member's health, the same way for the llama-server pool
(`rag.clients.llm_pool`) and the embedding pool (`rag.clients.embedding_pool`).

A member is `ok` (it takes requests), `loading` (it answers 503 while its model loads), `down` (it
failed a request or a health check, or gave no answer in time) or `refused` (it answers, but serves
another model than the pool's: a difference there would mix two models' answers or vectors). A member
that failed rests for the pool's rest time before a request may try it again (the llama-server pool
rests none: its background probes bring a member back); a health check that finds it well again ends
its rest. The pool is `ok` while any member is, else `loading` while any member is, else `down`; its
reason names each member's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal

log = logging.getLogger(__name__)

State = Literal["ok", "loading", "down", "refused"]


@dataclass(eq=False, kw_only=True)  # members are told apart by identity
class MemberHealth:
    """One member's health as its pool judges it (a pool's member classes extend this, and give `url`)."""

    kind: ClassVar[str] = "server"  # what the member is, in the log
    state: State = "down"
    reason: str = "not asked yet"
    failures: int = 0  # requests it failed
    resting_until: float = 0.0  # time.monotonic() before which no request tries it again

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        return self.state == "ok"

    def resting(self) -> bool:
        return time.monotonic() < self.resting_until

    def join(self, note: str = "") -> None:
        """It answered well: it takes requests from now on (`note`: what the log adds, e.g. its slots)."""
        if self.state != "ok":
            log.info("%s %s joins the pool%s", self.kind, self.url, note)
        self.state, self.reason, self.resting_until = "ok", "", 0.0

    def leave(self, state: Literal["loading", "down"], reason: str) -> None:
        """It is loading or down, for `reason`."""
        if self.state == "ok":
            log.warning("%s %s leaves the pool: %s", self.kind, self.url, reason)
        self.state, self.reason = state, reason

    def failed(self, reason: str, rest_s: float = 0.0) -> None:
        """It failed a request: down, and resting for `rest_s`."""
        self.failures += 1
        self.leave("down", reason)
        self.resting_until = time.monotonic() + rest_s

    def refuse(self, reason: str) -> None:
        """It serves another model than the pool's: kept out until it serves the pool's."""
        self.state, self.reason = "refused", reason

    def pardon(self) -> None:
        """Refused no more: the pool's model is the one it serves after all (a rest it began goes on)."""
        self.state, self.reason = "ok", ""


def pool_state(states: Iterable[str]) -> Literal["ok", "loading", "down"]:
    """The pool's state from its members': ok while any is, else loading while any is, else down."""
    seen = set(states)
    return "ok" if "ok" in seen else "loading" if "loading" in seen else "down"


def reasons(members: Iterable[MemberHealth]) -> str:
    """Why each member is as it is, for an error or /health: "url: reason; url: reason"."""
    return "; ".join(f"{m.url}: {m.reason or m.state}" for m in members)
