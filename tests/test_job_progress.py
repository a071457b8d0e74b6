"""An upload job's progress as `GET /v1/jobs/{id}` shows it: the file being read and, for a scan, its page."""

from __future__ import annotations

from pathlib import Path

from ingest.jobs import Job
from ingest.pipeline import SourceFile


def test_a_job_shows_the_page_ocr_is_reading_until_the_next_file_starts(tmp_path: Path) -> None:
    job = Job(id="job-1", collection="default")
    scan, note = (SourceFile(tmp_path / name, name, name) for name in ("scan.pdf", "note.txt"))
    job.file_started(scan)
    assert job.to_api()["current_page"] is None
    job.page_read(scan, 3, 25)
    assert (job.to_api()["current_file"], job.to_api()["current_page"]) == ("scan.pdf", "3 of 25")
    job.file_started(note)
    assert (job.to_api()["current_file"], job.to_api()["current_page"]) == ("note.txt", None)
