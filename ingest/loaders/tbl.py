"""tbl tables in a man page's troff source, rewritten so that their cells survive rendering as cells.

tbl draws a table as text aligned in columns, and the columns of that text cannot be told apart again
(a cell of two words looks like two cells). So before groff runs, each `.TS` ... `.TE` block is
rewritten into plain troff that prints every cell on lines of its own between marker lines: groff still
renders the cells' fonts, escapes and macros (a `T{` text block included), and `read_table` takes the
marked lines of the rendered text back as rows of cells, which the man loader writes as a markdown
table (`ingest.loaders.tables`), its first row the header. A block without its `.TE` is left to tbl.

tbl's source: an options line ending in `;` (`tab(@)` names the cell separator), format lines up to one
ending in `.` (`.T&` starts new ones), then one data line per row: cells split at the tab, `T{` ... `T}`
for a cell of several lines, `_` and `=` for rules, `\\^` for a cell spanned from above.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

_TS = re.compile(r"^[.']\s*TS\b")
_TE = re.compile(r"^[.']\s*TE\b")
_TABLE_CONTINUES = re.compile(r"^[.']\s*T&")
_TAB_OPTION = re.compile(r"\btab\s*\(\s*(.)\s*\)", re.I)
_RULES = {"_", "=", "\\_", "\\=", "\\^", "^"}
_FILL = "rag-tbl-fill"  # a register keeping the fill mode the table was in


@dataclass(frozen=True, slots=True)
class Markers:
    """The marker lines of one rendering, with a random part so a page cannot print them itself."""

    table: str
    row: str
    cell: str
    end: str

    @classmethod
    def new(cls) -> Markers:
        tag = secrets.token_hex(6)
        return cls(*(f"RAGTBL{tag}{part}" for part in ("table", "row", "cell", "end")))


def rewrite_tables(source: str, markers: Markers) -> str:
    """`source` with each complete tbl block replaced by troff printing its cells between `markers`."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not _TS.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if _TE.match(lines[j])), None)
        if end is None:
            out.extend(lines[i:])
            break
        out += _marked(_rows(lines[i + 1 : end]), markers)
        i = end + 1
    return "\n".join(out)


def _rows(block: list[str]) -> list[list[list[str]]]:
    """The data rows of a tbl block: each a list of cells, each cell its source lines."""
    tab, i = "\t", 0
    if block and block[0].rstrip().endswith(";"):
        if (option := _TAB_OPTION.search(block[0])) is not None:
            tab = option.group(1)
        i = 1
    i = _after_format(block, i)
    rows: list[list[list[str]]] = []
    while i < len(block):
        line = block[i]
        i += 1
        if _TABLE_CONTINUES.match(line):
            i = _after_format(block, i)
        elif line.startswith((".", "'")) or line.strip() in _RULES:
            continue  # requests between rows (comments, spacing, `.TH` of a repeated header) and rules
        else:
            row, i = _row(line, block, i, tab)
            rows.append(row)
    return rows


def _after_format(block: list[str], i: int) -> int:
    while i < len(block):
        i += 1
        if block[i - 1].rstrip().endswith("."):
            break
    return i


def _row(line: str, block: list[str], i: int, tab: str) -> tuple[list[list[str]], int]:
    """The cells of the data line `line` (whose text blocks may go on over `block[i:]`), and where the next line is."""
    cells: list[list[str]] = []
    rest: str | None = line
    while rest is not None:
        cell, sep, after = rest.partition(tab)
        if cell.rstrip().endswith("T{"):
            lead = cell.rstrip()[:-2]
            text = [lead] if lead.strip() else []
            while i < len(block) and not block[i].startswith("T}"):
                text.append(block[i])
                i += 1
            closing = block[i][2:] if i < len(block) else ""
            i += 1
            cells.append(text)
            rest = closing[1:] if closing.startswith(tab) else (closing or None)
            continue
        cells.append([] if cell.strip() in _RULES else [cell])
        rest = after if sep else None
    return cells, i


def _marked(rows: list[list[list[str]]], markers: Markers) -> list[str]:
    """troff printing each cell's lines after a cell marker, each row after a row marker."""
    out = [f".nr {_FILL} \\n[.u]", ".nf", f"\\&{markers.table}"]
    for row in rows:
        out.append(f"\\&{markers.row}")
        for cell in row:
            out.append(f"\\&{markers.cell}")
            if len(cell) > 1 or any(line.startswith((".", "'")) for line in cell):
                out += [".fi", *cell, ".br", ".nf"]  # a text block: filled, its requests obeyed
            else:
                out += [f"\\&{line}" for line in cell]
    out += [f"\\&{markers.end}", f".if \\n[{_FILL}] .fi"]
    return out


def read_table(lines: list[str], i: int, markers: Markers) -> tuple[list[list[str]], int]:
    """The rows of the table whose marker line is `lines[i - 1]` in the rendered text, and the index of
    the line after its end marker. A cell's rendered lines are joined by spaces."""
    rows: list[list[str]] = []
    cell: list[str] | None = None
    while i < len(lines) and markers.end not in lines[i]:
        line = lines[i]
        i += 1
        if markers.row in line:
            rows.append([])
            cell = None
        elif markers.cell in line:
            if not rows:
                rows.append([])
            cell = []
            rows[-1].append("")
        elif cell is not None and line.strip():
            cell.append(line.strip())
            rows[-1][-1] = " ".join(cell)
    return rows, i + 1
