"""The question sets the tests and the quality gate read (README.md here: what they are, their licence)."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SQUAD = HERE / "squad-v1.1-dev-slice.json"  # the first 6 articles of the SQuAD v1.1 dev set
CMRC = HERE / "cmrc2018-trial.json"  # the whole CMRC 2018 trial set
