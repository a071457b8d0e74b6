"""Child processes that die with their parent, however the parent ends (SIGKILL included).

    subprocess.Popen(command, preexec_fn=die_with_parent())

Linux's `prctl(PR_SET_PDEATHSIG, SIGKILL)`, armed in the child between fork and exec: the kernel kills
the child when the thread that started it exits, so a server started for one run (the embedding server
of `ingest`, the parts of `rag up`) never outlives it as an orphan holding memory and a port.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when its parent (this process by default) dies."""
    parent = os.getpid() if parent is None else parent
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm
