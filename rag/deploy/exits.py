"""How a part's process ended, in words, with what to do about it where that is known: one line."""

from __future__ import annotations

import signal

REBUILD = (
    "rebuild with `bash scripts/build-llama-server.sh` (it test-runs each build and keeps a form that runs "
    "on this CPU), or start llama-server with LLAMA_ARG_REPACK=0 (no AMX or repacked-weight kernels)"
)

# For a part whose name starts with the key, killed by the signal: the remedy.
REMEDIES: dict[tuple[str, signal.Signals], str] = {
    ("llama-server", signal.SIGILL): "the binary uses an instruction this CPU refuses: " + REBUILD,
    ("llama-server", signal.SIGSEGV): "see its log; `bash scripts/build-llama-server.sh` test-runs the build here",
    ("llama-server", signal.SIGBUS): "a model file changed or shrank while mapped? check it with `rag models verify`",
}
ANY_PART: dict[signal.Signals, str] = {
    signal.SIGKILL: "if nobody sent it, the kernel ran out of memory (`dmesg` names the process it killed)",
}


def killed_by(code: int | None) -> signal.Signals | None:
    """The signal that ended a process: Popen's negative return code, or a shell's 128 + N."""
    if code is None or not (code < 0 or code > 128):
        return None
    try:
        return signal.Signals(-code if code < 0 else code - 128)
    except ValueError:
        return None


def how_it_ended(code: int | None) -> str:
    """'was killed by SIGILL (illegal instruction)' for -4; 'exited with code 3' for 3."""
    sig = killed_by(code)
    if sig is None:
        return "exited" if code is None else f"exited with code {code}"
    words = (signal.strsignal(sig) or "").lower()
    said = f"{sig.name} ({words})" if words and words != "killed" else sig.name
    return f"was killed by {said}" if code is not None and code < 0 else f"exited with code {code}: killed by {said}"


def remedy(name: str, code: int | None) -> str:
    """' — what to do' for a part that ended so, or ''."""
    sig = killed_by(code)
    if sig is None:
        return ""
    for (prefix, known), text in REMEDIES.items():
        if known == sig and name.startswith(prefix):
            return f" — {text}"
    return f" — {ANY_PART[sig]}" if sig in ANY_PART else ""


def ended(name: str, code: int | None, when: str = "") -> str:
    """'llama-server was killed by SIGILL (illegal instruction) during start-up — the binary ...'."""
    return f"{name} {how_it_ended(code)}{when}{remedy(name, code)}"
