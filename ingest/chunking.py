"""Chunking: a `LoadedDocument` in, `Chunk`s small enough for the embedder out.

    chunker = Chunker.from_tokenizer(tokenizer, chunk_tokens=200, chunk_overlap=32, max_sequence=256)
    chunks = chunk_document(doc, doc_id, chunker)

Lengths are counted with the embedding model's own tokenizer (a Hugging Face tokenizer, a
`tokenizers.Tokenizer`, or any `Callable[[str], int]`), so every chunk holds at most `chunk_tokens`
tokens, counted exactly; `max_sequence` checks that this plus the model's special tokens fits.

Each section of the document is split on its own, so a chunk never crosses a heading boundary or a
PDF page, and carries its section's page and heading path. Inside a section, the split is langchain's
`RecursiveCharacterTextSplitter` (separators kept at the end of their piece, nothing stripped): on
paragraphs, lines, then sentence and clause punctuation (Chinese full-width marks included, so text
without spaces splits at sentence ends) and finally characters, merging pieces back up to the target with
`chunk_overlap` tokens of overlap. We run the same recursion and merge over offsets instead of strings
(`_Splitter`): langchain returns only the chunks' text, and in repetitive text (a log of identical lines,
a table of equal rows) a chunk's text occurs at many places, so its place cannot be found again by
searching. Working on spans, each chunk is an exact slice of the extracted text by construction:
`doc.text[c.start:c.end] == c.text`, and the chunk texts are langchain's (a test compares them).

Speed: the tokenizer is the cost. Counts are cached, every level of the recursion counts its pieces in
one batched tokenizer call (Rust, parallel), and the finished chunks are counted in one more batch. A
section that fits is a single call.

A table's section (`Section.table_header` set: see `ingest.loaders.tables`) that does not fit is cut
between rows, never inside one (unless a row alone is over the limit), without overlap, and each chunk
after the first starts with the table's caption and header row (`Chunk.lead`), so a chunk of rows 40-60
still names its columns. A table that fits stays one chunk.

Every chunk carries the boxes of its section that overlap it (where its text sits on the page).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rag.core.errors import DocumentRejected

from .models import Chunk, LoadedDocument, Section

if TYPE_CHECKING:
    from rag.core.config import Settings

SEPARATORS = ["\n\n", "\n", "。", "！", "？", "；", ". ", "! ", "? ", "; ", "，", ", ", " ", ""]
_CACHE_SIZE = 1 << 16
# Past 16 characters a token on average a text almost surely does not fit, so we do not count it
# whole before splitting (a speed shortcut only: the splitter returns one chunk if it does fit); and a
# text longer than max_chunks chunks at this rate is refused from its length alone.
_MAX_CHARS_PER_TOKEN = 16


class TokenCounter:
    """Token counts with a cache and an optional batch path (`many`) to fill it."""

    def __init__(self, one: Callable[[str], int], many: Callable[[list[str]], list[int]] | None = None) -> None:
        self._one = one
        self._many = many
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        n = self._cache.get(text)
        if n is None:
            n = self._store(text, self._one(text))
        return n

    def prime(self, texts: Iterable[str]) -> None:
        """Counts the texts not cached yet, in one batch when the tokenizer has a batch path."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if not missing:
            return
        counts = self._many(missing) if self._many is not None and len(missing) > 1 else map(self._one, missing)
        for text, n in zip(missing, counts, strict=True):
            self._store(text, n)

    def _store(self, text: str, n: int) -> int:
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()  # cheaper than LRU bookkeeping; the working set is one section
        self._cache[text] = n
        return n


class Chunker:
    """Splits sections into chunks of at most `chunk_tokens` tokens by `count_tokens`."""

    def __init__(
        self,
        count_tokens: Callable[[str], int] | TokenCounter,
        chunk_tokens: int = 200,
        chunk_overlap: int = 32,
        max_chunks: int | None = None,
    ) -> None:
        if chunk_tokens < 1 or not 0 <= chunk_overlap < chunk_tokens:
            raise ValueError(f"need 0 <= chunk_overlap ({chunk_overlap}) < chunk_tokens ({chunk_tokens})")
        self.count_tokens = count_tokens if isinstance(count_tokens, TokenCounter) else TokenCounter(count_tokens)
        self.chunk_tokens = chunk_tokens
        self.chunk_overlap = chunk_overlap
        self.max_chunks = max_chunks

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        chunk_tokens: int = 200,
        chunk_overlap: int = 32,
        max_sequence: int | None = None,
        max_chunks: int | None = None,
    ) -> Chunker:
        """A chunker counting with a Hugging Face tokenizer (or a `tokenizers.Tokenizer`).

        `max_sequence` is the embedder's limit including special tokens (256 for all-MiniLM-L6-v2);
        ValueError if `chunk_tokens` plus the tokenizer's special tokens would not fit in it.
        """
        count, specials = token_counter(tokenizer)
        if max_sequence is not None and chunk_tokens + specials > max_sequence:
            raise ValueError(
                f"chunk_tokens={chunk_tokens} plus {specials} special tokens exceeds the embedder's {max_sequence}"
            )
        return cls(count, chunk_tokens, chunk_overlap, max_chunks)

    @classmethod
    def from_settings(cls, settings: Settings, tokenizer: Any, max_sequence: int | None = None) -> Chunker:
        """`from_tokenizer` with the sizes in `settings` (RAG_CHUNK_TOKENS, RAG_CHUNK_OVERLAP, RAG_MAX_DOCUMENT_CHUNKS)."""
        return cls.from_tokenizer(
            tokenizer, settings.chunk_tokens, settings.chunk_overlap, max_sequence, settings.max_document_chunks
        )

    def split(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, tokens) of each chunk of `text`: exact slices, stripped, none over the limit."""
        if not text.strip():
            return []
        if len(text) <= self.chunk_tokens * _MAX_CHARS_PER_TOKEN and self.count_tokens(text) <= self.chunk_tokens:
            return _stripped(text, [(0, len(text))], self.count_tokens)
        return self._enforce_limit(text, self._split(text, self.chunk_tokens))

    def _split(self, text: str, size: int) -> list[tuple[int, int, int]]:
        spans = _Splitter(self.count_tokens, size, min(self.chunk_overlap, size // 2)).spans(text)
        self.count_tokens.prime(text[s:e].strip() for s, e in spans)
        return _stripped(text, spans, self.count_tokens)

    def chunk(self, doc: LoadedDocument, doc_id: str) -> list[Chunk]:
        """The document's chunks in reading order, numbered from 0."""
        self.check_length(doc)
        chunks: list[Chunk] = []
        for section in doc.sections:
            for start, end, tokens, lead in self._section_spans(section):
                chunks.append(_chunk(doc, doc_id, len(chunks), section, start, end, tokens, lead))
            # Checked section by section, before anything is embedded: the work stops near the bound.
            if self.max_chunks is not None and len(chunks) > self.max_chunks:
                raise DocumentRejected(
                    f"{doc.name} makes more than {self.max_chunks:,} chunks (RAG_MAX_DOCUMENT_CHUNKS)",
                    limit=self.max_chunks,
                )
        return chunks

    def _section_spans(self, section: Section) -> list[tuple[int, int, int, str]]:
        """(start, end, tokens, lead) of the section's chunks; a lead is repeated text before the slice."""
        header = section.table_header
        whole = section.text
        fits = len(whole) <= self.chunk_tokens * _MAX_CHARS_PER_TOKEN and self.count_tokens(whole) <= self.chunk_tokens
        if not header or fits or self.count_tokens(header) * 2 > self.chunk_tokens:
            return [(s, e, t, "") for s, e, t in self.split(whole)]
        return self._table_spans(whole, header)

    def _table_spans(self, text: str, header: str) -> list[tuple[int, int, int, str]]:
        """Rows packed greedily under the limit; the first chunk holds the header itself."""
        lead = header + "\n"
        rows = _lines(text, len(header))
        self.count_tokens.prime([text[s:e] for s, e in rows] + [lead])
        room = self.chunk_tokens - self.count_tokens(lead)
        out: list[tuple[int, int, int, str]] = []
        i = 0
        while i < len(rows):
            first = not out
            start = 0 if first else rows[i][0]
            used, j = 0, i
            while j < len(rows) and (j == i or used + self.count_tokens(text[rows[j][0] : rows[j][1]]) <= room):
                used += self.count_tokens(text[rows[j][0] : rows[j][1]])
                j += 1
            while True:  # the estimate adds counts of parts: check the joined text exactly
                piece = ("" if first else lead) + text[start : rows[j - 1][1]]
                tokens = self.count_tokens(piece)
                if tokens <= self.chunk_tokens or j - 1 == i:
                    break
                j -= 1
            if tokens > self.chunk_tokens:  # one row alone over the limit: split it, each piece under the header
                row_start, row_end = rows[i]
                for s, e, _ in self._enforce_room(text[row_start:row_end], room):
                    out.append(
                        (
                            row_start + s,
                            row_start + e,
                            self.count_tokens(lead + text[row_start + s : row_start + e]),
                            lead,
                        )
                    )
            else:
                out.append((start, rows[j - 1][1], tokens, "" if first else lead))
            i = j
        return out

    def _enforce_room(self, row: str, room: int) -> list[tuple[int, int, int]]:
        size = room
        while True:
            spans = self._split(row, size)
            if all(t <= room for _, _, t in spans) or size == 1:
                return spans
            size = max(1, size * 3 // 4)

    def check_length(self, doc: LoadedDocument) -> None:
        """Refuses, before any tokenizing, a text too long for `max_chunks` even at `_MAX_CHARS_PER_TOKEN`
        characters a token (English runs 4-5, Chinese 1-2: a real document is far under the estimate)."""
        if self.max_chunks is None:
            return
        chars = sum(len(section.text) for section in doc.sections)
        if chars > self.max_chunks * self.chunk_tokens * _MAX_CHARS_PER_TOKEN:
            raise DocumentRejected(
                f"{doc.name} makes more than {self.max_chunks:,} chunks (RAG_MAX_DOCUMENT_CHUNKS): its {chars:,} "
                f"characters would need over {chars // (self.chunk_tokens * _MAX_CHARS_PER_TOKEN):,}",
                limit=self.max_chunks,
            )

    def _enforce_limit(self, text: str, spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Re-splits the rare chunk whose exact count exceeds the limit.

        The splitter sums the counts of pieces, and a tokenizer may count a joined string differently
        from its parts (subword merges across a cut), so the merged total can be off by a few.
        """
        out: list[tuple[int, int, int]] = []
        for start, end, tokens in spans:
            if tokens <= self.chunk_tokens:
                out.append((start, end, tokens))
                continue
            piece = text[start:end]
            size = self.chunk_tokens
            while True:
                size = max(1, size * 3 // 4)
                inner = self._split(piece, size)
                if all(t <= self.chunk_tokens for _, _, t in inner) or size == 1:
                    break
            out.extend((start + s, start + e, t) for s, e, t in inner)
        return out


def chunk_document(doc: LoadedDocument, doc_id: str, chunker: Chunker) -> list[Chunk]:
    """The chunks of `doc` (see `Chunker.chunk`)."""
    return chunker.chunk(doc, doc_id)


def token_counter(tokenizer: Any) -> tuple[TokenCounter, int]:
    """(count without special tokens, number of special tokens added) for an HF or `tokenizers` tokenizer."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        backend = tokenizer  # set up in place below: a `tokenizers.Tokenizer` is given to count with
    elif (shared := getattr(tokenizer, "backend_tokenizer", None)) is not None:
        # A private copy of the HF tokenizer's own (copying multilingual-e5-small's costs a CPU second).
        backend = Tokenizer.from_str(shared.to_str())
    else:  # a slow (pure-Python) HF tokenizer
        return TokenCounter(
            lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        ), tokenizer.num_special_tokens_to_add()
    # Saved tokenizers often carry truncation and padding (MiniLM's pads everything to 128), which would
    # make every count wrong.
    backend.no_truncation()
    backend.no_padding()
    specials = backend.num_special_tokens_to_add(is_pair=False)

    def one(text: str) -> int:
        return len(backend.encode(text, add_special_tokens=False).ids)

    def many(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]

    return TokenCounter(one, many), specials


class _Splitter:
    """langchain's `RecursiveCharacterTextSplitter._split_text` and `_merge_splits` (keep_separator="end",
    strip_whitespace=False, joined with ""), on (start, end) spans of one text."""

    def __init__(self, count: TokenCounter, size: int, overlap: int) -> None:
        self.count = count
        self.size = size
        self.overlap = overlap

    def spans(
        self, text: str, start: int = 0, end: int | None = None, separators: list[str] = SEPARATORS
    ) -> list[tuple[int, int]]:
        end = len(text) if end is None else end
        piece = text[start:end]
        for i, sep in enumerate(separators):  # noqa: B007 (i and sep are read after the loop)
            if sep == "" or sep in piece:
                break
        rest = separators[i + 1 :] if sep else []
        splits = _split_keeping_end(text, start, end, sep)
        self.count.prime(text[s:e] for s, e in splits)
        out: list[tuple[int, int]] = []
        good: list[tuple[int, int]] = []
        for s, e in splits:
            if self.count(text[s:e]) < self.size:
                good.append((s, e))
                continue
            out.extend(self._merge(text, good))
            good = []
            out.extend(self.spans(text, s, e, rest) if rest else [(s, e)])
        out.extend(self._merge(text, good))
        return out

    def _merge(self, text: str, splits: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Consecutive splits joined up to `size` tokens, each chunk starting with the last splits of the
        one before that fit in `overlap` tokens (langchain's token sums, so the same chunks)."""
        out: list[tuple[int, int]] = []
        current: list[tuple[int, int]] = []
        total = 0
        for s, e in splits:
            n = self.count(text[s:e])
            if total + n > self.size and current:
                out.append((current[0][0], current[-1][1]))
                while total > self.overlap or (total + n > self.size and total > 0):
                    total -= self.count(text[current[0][0] : current[0][1]])
                    current = current[1:]
            current.append((s, e))
            total += n
        if current:
            out.append((current[0][0], current[-1][1]))
        return out


def _lines(text: str, start: int) -> list[tuple[int, int]]:
    """(start, end) of the non-blank lines of `text` from `start` on."""
    spans, at = [], start
    for line in text[start:].split("\n"):
        if line.strip():
            spans.append((at, at + len(line)))
        at += len(line) + 1
    return spans


def _split_keeping_end(text: str, start: int, end: int, sep: str) -> list[tuple[int, int]]:
    """Spans of text[start:end] cut after each `sep` (kept at the end of its piece); no empty ones."""
    if not sep:
        return [(i, i + 1) for i in range(start, end)]
    spans = []
    at = start
    while (found := text.find(sep, at, end)) >= 0:
        spans.append((at, found + len(sep)))
        at = found + len(sep)
    if at < end:
        spans.append((at, end))
    return spans


def _stripped(text: str, spans: list[tuple[int, int]], count: Callable[[str], int]) -> list[tuple[int, int, int]]:
    """Spans with surrounding whitespace removed (offsets shifted), empty ones dropped, tokens counted."""
    out = []
    for start, end in spans:
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        trimmed = piece.strip()
        if trimmed:
            out.append((start + lead, start + lead + len(trimmed), count(trimmed)))
    return out


def _chunk(
    doc: LoadedDocument, doc_id: str, index: int, section: Section, start: int, end: int, tokens: int, lead: str = ""
) -> Chunk:
    begin, stop = section.start + start, section.start + end
    return Chunk(
        doc_id=doc_id,
        index=index,
        source=doc.name,
        text=lead + section.text[start:end],
        start=begin,
        end=stop,
        n_tokens=tokens,
        page=section.page,
        headings=section.headings,
        boxes=tuple(b for b in section.boxes if b.start < stop and b.end > begin),
        lead=lead,
    )
