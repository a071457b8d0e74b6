"""The owner lease: which rows of the catalog a running process works on (a file lock per process)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from filelock import FileLock, Timeout


class OwnerLease:
    """This process's claim on the rows it is working on, held as a file lock until the process ends.

    A lock dies with its process (even on kill -9), so a row whose owner's lock can be taken belongs to
    a process that is gone, whatever became of its pid.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.lost: str | None = None  # a file lock is never lost while its process lives (PgOwnerLease's can be)
        self._lock = FileLock(str(directory / f"{self.token}.lock"))
        self._lock.acquire(timeout=0)

    def is_live(self, token: str | None) -> bool:
        """Whether the owner `token` is this process or another one still running."""
        if token is None:
            return False
        if token == self.token:
            return True
        path = self.directory / f"{token}.lock"
        if not path.exists():
            return False
        probe = FileLock(str(path))
        try:
            probe.acquire(timeout=0)
        except Timeout:
            return True
        probe.release()
        return False

    def check(self) -> None:
        """Raise when rows must not be claimed under this lease (never for a file lock)."""

    def held_elsewhere(self, token: str | None) -> bool:
        """Whether another live process works on a row owned by `token`. Callers hold the document's lock,
        so a row of this process that is still pending or deleting was left by a failed run: it may be
        taken over."""
        return token != self.token and self.is_live(token)

    def forget(self, token: str) -> None:
        """Remove the lock file of a dead owner."""
        if token != self.token:
            (self.directory / f"{token}.lock").unlink(missing_ok=True)

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()
            (self.directory / f"{self.token}.lock").unlink(missing_ok=True)
