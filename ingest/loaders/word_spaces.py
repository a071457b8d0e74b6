"""The spaces between the words of an OCR line, taken from the white gaps in the line's image.

    text = spaced(text, page, box, chars)   # chars: RapidOCR's (character, score, box) of the line

The recogniser often reads a rough scan's word space as nothing at all ("andstored", "6years"): its
CTC decoder picks "no character" over the space where the space is narrow or blurred, and search and
answers then miss the words. The ink still shows the gap. So the line is cut out of the page as the
recogniser saw it (the detector's box, straightened), its runs of columns without ink are found, and each
space the recogniser did read takes the run it stands on; a run left over between two characters (their
positions from RapidOCR's box of each, `return_single_char_box`) that is about as wide as the line's own
spaces is a space too. Never inside a number, nor before closing punctuation or after opening
punctuation; a line with Chinese in it is left as read (Chinese has no spaces, "16名" stays one word, and
its full-width punctuation has white inside the glyph: bench/scanned_rough.py --sets cmrc lost answers to it).

RapidOCR's own word boxes (`return_word_box`) do not help: it cuts words at the spaces it read and at gaps
of more than 5 decoder steps (some 40 pixels of a 48-pixel-high line), far wider than a word space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.core.cjk import has_cjk, is_cjk

# Word gaps against letter gaps, as shares of the line's ink height. Measured on DejaVu Sans and Serif at 150
# and 200 dpi, blurred, tilted and JPEG-compressed (bench/scanned_rough.py): letter gaps reach 0.25 (DejaVu
# Sans is set loose) and word gaps fall to 0.21 (Serif, blurred), so one share for all fonts cannot tell
# them apart. A line's own spaces can: the recogniser reads most of them, and a run together pair whose
# gap is as wide as a good share of those is a space too.
WORD_GAP_SHARE = 0.7  # of the median gap at the spaces the recogniser read in this line
WORD_GAP_MIN = 0.2  # never narrower than this share of the ink height
WORD_GAP_ALONE = 0.3  # with fewer than two spaces read in the line to compare with
_SPECK = 0.006  # ink blobs smaller than this share of the ink height squared are speckle, not strokes
_NO_SPACE_BEFORE = frozenset(",.;:!?)]}%’”'\"")
_NO_SPACE_AFTER = frozenset("([{‘“")


def spaced(text: str, page: Any, box: Any, chars: Sequence[tuple[str, float, Any]]) -> str:
    """`text` with a space wherever the line's image has a word gap between two characters run together."""
    letters = [c for c in text if not c.isspace()]
    if len(letters) < 2 or len(letters) != len(chars) or has_cjk(text):
        # The characters' boxes do not match the text, or the line is Chinese: its full-width
        # punctuation carries white inside the glyph ("。2013年" is not "。 2013年"), and the Latin
        # words in it are measured against no spaces of its own. Left as read.
        return text
    quad = np.asarray(box, dtype=np.float32)
    crop = _straightened(page, quad)
    if crop is None:
        return text
    runs, ink_height = _white_runs(crop)
    if not runs:
        return text
    axis = quad[1] - quad[0]
    scale = crop.shape[1] / (float(axis @ axis) or 1.0)
    centres = [float((np.asarray(q, dtype=np.float32).mean(axis=0) - quad[0]) @ axis) * scale for _, _, q in chars]
    read = _spaces_read(text)
    claimed = _claimed(runs, centres, read)
    known = [claimed[i][1] - claimed[i][0] for i in read if i in claimed]
    if len(known) >= 2:
        threshold = max(WORD_GAP_MIN, WORD_GAP_SHARE * float(np.median(known)) / ink_height)
    else:
        threshold = WORD_GAP_ALONE
    free = [run for run in runs if run not in claimed.values()]
    gaps = [_widest(free, centres[i], centres[i + 1]) / ink_height for i in range(len(centres) - 1)]
    out: list[str] = []
    n = -1  # index in `letters` of the last character written
    for c in text:
        if not c.isspace():
            if n >= 0 and n not in read and gaps[n] >= threshold and _splits(letters[n], c):
                out.append(" ")
            n += 1
        out.append(c)
    return "".join(out)


def _spaces_read(text: str) -> set[int]:
    """The indices i (among the non-space characters) of `text` followed by a space."""
    after: set[int] = set()
    n = -1
    for c in text:
        if c.isspace():
            if n >= 0:
                after.add(n)
        else:
            n += 1
    return after


def _claimed(runs: list[tuple[float, float]], centres: list[float], read: set[int]) -> dict[int, tuple[float, float]]:
    """For each space the recogniser read (after character i), the white run that is that space: the
    widest between the two characters, or, when there is none, the widest within a character either
    side. A character's position is where the recogniser read it, which can lie past its ink: the second
    l of "still find" is placed inside the space after it (the decoder needs a blank between two equal
    letters), so that the space seems to lie between the l's."""
    claimed: dict[int, tuple[float, float]] = {}
    for i in sorted(read):
        last = len(centres) - 1
        for left, right in (
            (centres[i], centres[min(i + 1, last)]),
            (centres[max(i - 1, 0)], centres[min(i + 2, last)]),
        ):
            near = [run for run in runs if left < (run[0] + run[1]) / 2 < right and run not in claimed.values()]
            if near:
                claimed[i] = max(near, key=lambda run: run[1] - run[0])
                break
    return claimed


def _splits(before: str, after: str) -> bool:
    """Whether a space may go between these two characters at all: not inside a number ("1932": a 1
    stands apart in many fonts), not next to Chinese, not before closing or after opening punctuation."""
    return not (
        (before.isdigit() and after.isdigit())
        or is_cjk(before)
        or is_cjk(after)
        or after in _NO_SPACE_BEFORE
        or before in _NO_SPACE_AFTER
    )


def _widest(runs: list[tuple[float, float]], left: float, right: float) -> float:
    """The widest white run whose middle lies between two characters' centres (0 when none)."""
    return max((end - start for start, end in runs if left < (start + end) / 2 < right), default=0.0)


def _straightened(page: Any, quad: np.ndarray) -> np.ndarray | None:
    """The line's pixels as the recogniser read them: the box warped upright, grayscale; None when tall."""
    width = int(max(np.linalg.norm(quad[0] - quad[1]), np.linalg.norm(quad[2] - quad[3])))
    height = int(max(np.linalg.norm(quad[0] - quad[3]), np.linalg.norm(quad[1] - quad[2])))
    if width < 2 or height < 2 or height >= 1.5 * width:
        return None  # a vertical line: its characters run top to bottom
    import cv2  # here, not at the top: the parser workers import this module under a memory limit OpenCV's import breaks

    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    image = np.asarray(page)
    try:
        matrix = cv2.getPerspectiveTransform(quad, target)
        if image.ndim == 3:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        return cv2.warpPerspective(
            image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC
        )
    except cv2.error:
        return None  # a degenerate box (three corners in a line): the line keeps the spaces it was read with


def _white_runs(crop: np.ndarray) -> tuple[list[tuple[float, float]], float]:
    """The runs of columns without ink between the line's first and last ink, and the ink's height; only
    the band of rows around the densest row counts (the box can reach into the lines above and below)."""
    import cv2

    _, ink = cv2.threshold(crop, 0, 1, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
    top, bottom = _band(ink.sum(axis=1))
    if bottom <= top:
        return [], 1.0
    ink = np.ascontiguousarray(ink[top:bottom])
    ink_height = float(bottom - top)
    _, labels, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
    specks = np.flatnonzero(stats[:, cv2.CC_STAT_AREA] < max(3.0, _SPECK * ink_height**2))
    ink[np.isin(labels, specks[specks > 0])] = 0
    inked = np.flatnonzero(ink.sum(axis=0) > 0)
    apart = np.flatnonzero(np.diff(inked) > 1)
    return [(float(inked[i] + 1), float(inked[i + 1])) for i in apart], ink_height


def _band(rows: np.ndarray) -> tuple[int, int]:
    """The rows [top, bottom) of the run of inked rows around the densest one."""
    if rows.size == 0 or rows.max() == 0:
        return 0, 0
    inked = rows > 0.02 * rows.max()
    peak = int(rows.argmax())
    top, bottom = peak, peak + 1
    while top > 0 and inked[top - 1]:
        top -= 1
    while bottom < rows.size and inked[bottom]:
        bottom += 1
    return top, bottom
