"""groff, run on untrusted troff: a man page's source in, its rendered UTF-8 text out, within bounds.

    text = render_troff(source, "man", name, timeout_s=30)

groff (Debian's `groff-base`, which man-db depends on, so it is on nearly every Debian and Ubuntu system)
is the reference renderer of the man pages a Linux machine holds, tbl tables and Chinese pages included.
It runs as a child process: no shell, its input from a file, a minimal environment (a page cannot read
our variables through `\\V`), its own session (killed whole at the deadline), and limits on its CPU time,
its output's size and, inherited from the parser worker, its memory.

What a document could make troff do beyond typesetting is taken away. groff runs in safer mode (`-S`,
also its default: no `.sy`, `.pi`, `.pso`, `.open`), and a prelude removes every request that reads a
file (`.so`, `.mso`, `.cf`, `.trf`, `.nx`, `.hpf`...): removed requests cannot be called, aliased or
renamed back, and the macro packages (loaded from the command line, before the document) no longer
need them, so `.so /etc/passwd` or mdoc's `.Hf /etc/passwd` print nothing.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile

from rag.core.errors import DocumentRejected

MAX_OUTPUT_BYTES = 64 << 20
# Lines long enough that a paragraph renders as one line (no hyphenation, no justification spaces).
LINE_LENGTH = "1000n"
_PRELUDE = ".rm so mso cf trf nx rd pso sy pi open opena hpf hpfa\n.ad l\n.nh\n"
_MACROS = {"man": "an-old", "mdoc": "doc"}  # loaded directly: andoc.tmac would load them later with .mso
INSTALL_HINT = "install groff (Debian/Ubuntu: apt install groff-base; Fedora: dnf install groff-base)"


def groff_path() -> str | None:
    """Where groff is, or None."""
    return shutil.which("groff")


def render_troff(source: str, macros: str, name: str, timeout_s: float) -> str:
    """`source` (man or mdoc troff) rendered by groff as plain UTF-8 text; bold stays as overstrike
    ("N\\bN"), which shows the headings. DocumentRejected when groff is missing, too slow or too loud."""
    groff = groff_path()
    if groff is None:
        raise DocumentRejected(f"{name} is a man page (troff source); reading it needs groff: {INSTALL_HINT}")
    command = [
        groff, "-S", "-t", "-k", "-Kutf-8", f"-m{_MACROS[macros]}", "-Tutf8", "-P-c", "-P-u",
        f"-rLL={LINE_LENGTH}", "-rHY=0", "-rcR=1", "-Wall",
    ]  # fmt: skip
    env = {"PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(groff), "/usr/bin", "/bin"])), "LC_ALL": "C.UTF-8"}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout:
        stdin.write((_PRELUDE + source).encode("utf-8", errors="replace"))
        stdin.seek(0)
        code = _run(command, env, stdin.fileno(), stdout.fileno(), timeout_s, name)
        if code == -signal.SIGXFSZ:
            raise DocumentRejected(f"{name} renders to more than {MAX_OUTPUT_BYTES:,} bytes of text", limit="size")
        if code == -signal.SIGXCPU:
            raise DocumentRejected(f"{name} could not be rendered within {timeout_s:g} s", limit="time")
        if code != 0:
            raise DocumentRejected(f"{name}: groff failed rendering it (exit code {code})")
        stdout.seek(0)
        return stdout.read().decode("utf-8", errors="replace")


def _run(command: list[str], env: dict[str, str], stdin: int, stdout: int, timeout_s: float, name: str) -> int:
    cpu = max(1, int(timeout_s))

    def limit() -> None:  # in the child, before exec; the parser worker that runs us has one thread
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    process = subprocess.Popen(
        command,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tempfile.gettempdir(),
        start_new_session=True,
        preexec_fn=limit,  # noqa: PLW1509
    )
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DocumentRejected(f"{name} could not be rendered within {timeout_s:g} s", limit="time") from None
    finally:
        if process.poll() is None or process.returncode != 0:
            _kill_group(process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """groff's children (tbl, troff, grotty) are in its session: all of them go."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
