"""What of a source the question points at: the table rows it names, or the sentence that holds its terms.

A small base model asked for "the shortest exact phrase" of a 200-token chunk picks a wrong span of the
right chunk far more often than the wrong chunk: "imaps port?" over a chunk of /etc/services lines
answered "1080" (the socks line), and a markdown table collapsed onto one prompt line is a soup of cells.
So the extractive prompt shows a source with its most relevant part first:

- a table (markdown rows under a header, as `ingest.loaders.tables` writes them) or a listing (short
  lines, as /etc/services): the rows holding the question's rarest terms, each cell with its column's
  header ("Service: imaps; Port: 993/tcp"), in place of the whole table. Short lines whose fields are not
  set apart (by tabs or runs of spaces) are a term and its meaning on the next line ("noauto" / "do not
  mount when mount -a is given" in fstab(5) as a PDF; an exit value and then its meaning in a man page) or
  wrapped text: the named line comes with the lines on either side (in bench/real_docs the named line
  alone lacked the answer its chunk held in 17 of 31 such questions, with the lines around it in 3);
- prose: the sentence that holds the most of the question's terms first, then the rest in order.

Terms are the question's words less stopwords, compared by their first `STEM` letters ("expiry" meets
"expiration"), each weighted by how few lines or sentences of the source hold it; CJK text is left as it
is (no word boundaries to weigh).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from rag.core.cjk import has_cjk

STEM = 5  # letters a term is compared by
MAX_ROWS = 3  # rows shown for one question
LISTING_LINES = 4  # at least this many lines...
LISTING_LINE_WORDS = 8  # ...of at most this many words (median) make a listing (wrapped prose has more)
_WORD = re.compile(r"[^\W_]+(?:[./][^\W_]+)*", re.UNICODE)  # "993/tcp", "X.680" stay one word
_SEPARATOR_ROW = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")
_COLUMN_GAP = re.compile(r"(?<![.!?:;,])(?:\t| {2,})(?=\S)")  # between a record's fields, not after a sentence
_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[])|\n{2,}")
STOPWORDS = frozenset(
    """a an and are as at be by can could did do does for from has have how in is it its many much of on or
    that the this to was were what when where which who whom whose why will with""".split()
)


_ASKING_VERBS = frozenset({"indic", "mean", "means", "stand", "descr"})  # "what does X indicate/mean/stand for"


def words(text: str) -> set[str]:
    """The text's words, case-folded."""
    return set(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def terms(text: str) -> set[str]:
    """The text's words as compared: case-folded, stopwords out, cut to their first STEM letters."""
    return {w[:STEM] for w in words(text) if w not in STOPWORDS}


@dataclass(frozen=True)
class Table:
    """A markdown table's header cells and data rows (cells), as found in a source's text."""

    header: list[str]
    rows: list[list[str]]


def cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def find_table(lines: Sequence[str]) -> tuple[Table, int] | None:
    """The first markdown table among `lines` and the number of lines it takes (header and separator in)."""
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and _SEPARATOR_ROW.match(lines[i + 1].replace(" ", "")):
            rows = []
            for line in lines[i + 2 :]:
                if not (line.startswith("|") and line.endswith("|")):
                    break
                rows.append(cells(line))
            return Table(cells(lines[i]), rows), len(rows) + 2
    return None


def _weights(question: set[str], units: Sequence[set[str]]) -> dict[str, float]:
    """Each question term's weight: 1 / (the units that hold it); terms no unit holds are left out."""
    counts = {t: sum(1 for u in units if t in u) for t in question}
    return {t: 1.0 / n for t, n in counts.items() if n}


def _best(question: set[str], units: Sequence[set[str]]) -> tuple[list[int], float]:
    weights = _weights(question, units)
    scores = [sum(weights.get(t, 0.0) for t in u) for u in units]
    top = max(scores, default=0.0)
    return [i for i, s in enumerate(scores) if top > 0 and s == top], top


def named_rows(text: str, question: str) -> str | None:
    """The rows of a table or listing that the question names, each cell with its header; None when the
    text is neither, or no row is named more than the others (a term in every row names none)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    asked = terms(question)
    found = find_table(lines)
    if found is not None:
        table, taken = found
        if not table.rows or taken < len(lines) * 0.6:
            return None  # a table beside prose: the prose may be what is asked
        units = [terms(" ".join(row)) for row in table.rows]
        picked, top = _best(asked, units)
        if not picked or len(picked) > MAX_ROWS or top < 0.5:
            return None
        return "\n".join(
            "; ".join(f"{h}: {c}" if h else c for h, c in zip(table.header, table.rows[i], strict=False) if c)
            for i in picked
        )
    if len(lines) < LISTING_LINES or sorted(len(line.split()) for line in lines)[len(lines) // 2] > LISTING_LINE_WORDS:
        return None
    if has_cjk(text):
        return None
    units = [terms(line) for line in lines]
    picked, top = _best(asked, units)
    if not picked or len(picked) > MAX_ROWS or top < 0.5:
        return None
    if 2 * sum(1 for line in lines if _COLUMN_GAP.search(line)) < len(lines):  # no records: lines around too
        picked = sorted({j for i in picked for j in (i - 1, i, i + 1) if 0 <= j < len(lines)})
    return "\n".join(lines[i] for i in picked)


def row_terms(asked: set[str], table: Table) -> set[str]:
    """The question's terms that can name a row: not those of the column headers ("Which port does the
    ldaps service use?" names the ldaps row; "port" is in the tinc row's comment, "tinc control port", but
    names the Port column), unless they are all the question has."""
    header = terms(" ".join(table.header))
    return (asked - header) or asked


def _keyed(picked: list[int], rows: Sequence[list[str]], question: str) -> list[int]:
    """Of rows that tie, those with a cell made of the question's own words alone (none: no row is keyed):
    "x11" names the x11 row, not x11-1's to x11-7's, nor kerberos4's for "kerberos" (whole words here,
    not their first STEM letters); a row so named is named, however many rows share the term."""
    said = words(question)
    return [i for i in picked if any((found := words(cell)) and found <= said for cell in rows[i])]


def named_cell(text: str, question: str, *, keyed_only: bool = False) -> str | None:
    """The cell of a markdown table at the row and the one column the question names ("default of
    MaxAuthTries?": the MaxAuthTries row's Default cell). The row is named by the question's words that
    name no column (`row_terms`), in one cell (its key: a question whose words are spread over the row's
    cells asks about their content), and the column by the question's other words, more of them than any
    other column's header; else None. Rows that tie (kerberos over tcp and over udp) answer when their
    cells there agree. A row no cell of which is made of the question's own words (named by stems, or by
    what its cells say) gives only its first cell, the key a "Which constant ..." question asks for: the
    "submissions" row is no answer to "Which port does the submission service use?". `keyed_only`: only a
    row so named (what another chunk than the first must hold to be read instead)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    found = find_table(lines)
    if found is None or found[1] < len(lines) * 0.6 or not found[0].rows:
        return None
    table, asked = found[0], terms(question)
    picked, top = _best(row_terms(asked, table), [terms(" ".join(row)) for row in table.rows])
    keyed = _keyed(picked, table.rows, question)
    whole = bool(keyed)  # a row named by a cell of the question's own words, not by stems or content
    chosen = keyed or picked
    if not picked or len(chosen) > MAX_ROWS or (top < 0.5 and chosen == picked):
        return None
    picked = chosen
    found_cells = {_cell_of(table, table.rows[i], asked) for i in picked}
    if found_cells == {None} and len(picked) == 1 and whole:
        caption = terms(" ".join(line for line in lines if not line.startswith("|")))
        return _described(table, table.rows[picked[0]], asked, caption, question)
    if len(found_cells) != 1:
        return None
    cell = found_cells.pop()
    if not whole and (keyed_only or any(cell != table.rows[i][0] for i in picked)):
        return None  # a row named by a part of its words ("submissions" for "submission"): only its key
    return cell


def _cell_of(table: Table, row: list[str], asked: set[str]) -> str | None:
    """The row's cell in the column the question's words name, other than those of the row's key cell (the
    leftmost the question names; another cell may repeat the key's words, as "Submission [RFC4409]" in the
    comment does, but naming it by other words asks about that cell's content)."""
    naming = [j for j, cell in enumerate(row) if terms(cell) & asked]
    if not naming:
        return None
    key = naming[0]  # the leftmost cell the question names is the row's key; its header names no other column
    if any(terms(row[j]) & asked - terms(row[key]) for j in naming[1:]):
        return None  # the question's words are spread over the row's cells: it asks about their content
    rest = asked - terms(row[key]) - (terms(table.header[key]) if key < len(table.header) else set())
    counts = [len(terms(h) & rest) if j != key else 0 for j, h in enumerate(table.header[: len(row)])]
    best = max(counts, default=0)
    if best == 0 or counts.count(best) > 1:
        return None
    return row[counts.index(best)] or None


def _described(table: Table, row: list[str], asked: set[str], caption: set[str], question: str) -> str | None:
    """The cell right of the row's key, for a question that names the key and nothing but the table's own
    words ("What does the EADDRINUSE error constant indicate?" over Constant | Description: the description;
    "What is field 7 of /etc/shadow?" over Field | Name | Meaning: the name), when it is words: "What is
    MaxAuthTries?" over Option | Default | Meaning asks no default value."""
    said = words(question)
    key = next((j for j, cell in enumerate(row) if (found := words(cell)) and found <= said), None)
    if key is None:
        return None
    rest = asked - terms(row[key]) - terms(" ".join(table.header)) - caption - _ASKING_VERBS
    # A path ("/etc/passwd") names the file the table is of: a caption naming another is of another table.
    if any("/" not in t for t in rest) or (rest and any("/" in t for t in caption)):
        return None
    cell = next((cell for cell in row[key + 1 :] if words(cell)), None)
    return cell if cell is not None and re.search(r"[^\W\d_]{2}", cell) else None  # words, not a value


def sentence_first(text: str, question: str) -> str:
    """The text with the sentence holding the most of the question's terms moved to the front."""
    if has_cjk(question):
        return text
    sentences = [s for s in _SENTENCE.split(text.strip()) if s.strip()]
    if len(sentences) < 2:
        return text
    picked, _ = _best(terms(question), [terms(s) for s in sentences])
    if not picked or picked[0] == 0:
        return text
    first = picked[0]
    return " ".join([sentences[first], *(s for i, s in enumerate(sentences) if i != first)])


def focus(text: str, question: str, mode: str = "first") -> str:
    """What the extractive prompt shows of a source for `question` (`mode`: off, rows, first)."""
    if mode == "off" or not question:
        return text
    rows = named_rows(text, question)
    if rows is not None:
        return rows
    return sentence_first(text, question) if mode == "first" else text
