"""Words of a rough scan come out apart: the real OCR engine reads lines rendered in a sans and a serif
font, tilted, blurred, speckled and JPEG-compressed (pages on which the recogniser alone runs "for6",
"6years", "storedfor" and "10cases" together), and the spaces come back from the gaps in the ink, while
a Chinese line next to them gets none."""

from __future__ import annotations

import numpy as np
import pytest

from ingest.loaders.ocr import make_engine, recognize
from tests import scans

ENGLISH = "data were collected and stored for 6 years in 10 cases"
CHINESE = "青岚湖水库于1958年建成，总库容为三点二亿立方米，灌溉农田4万亩。"


@pytest.fixture(scope="module")
def engine() -> object:
    return make_engine(threads=1)


@pytest.mark.parametrize(("dpi", "seed"), [(150, 2), (200, 2), (200, 3)])
def test_words_and_numbers_of_a_rough_scan_keep_their_spaces(engine: object, dpi: int, seed: int) -> None:
    page = scans.lines_page([(ENGLISH, False), (ENGLISH, True), (CHINESE, False)], dpi=dpi)
    image = np.asarray(scans.rough(page, seed=seed).convert("L"))
    lines = sorted(recognize(engine, image), key=lambda line: line.y0)
    assert len(lines) == 3, [line.text for line in lines]
    sans, serif, chinese = (line.text for line in lines)
    for text in (sans, serif):
        assert text.lower().split() == ENGLISH.split(), text
    assert chinese == CHINESE, "no space goes between Chinese characters, nor between them and digits"
