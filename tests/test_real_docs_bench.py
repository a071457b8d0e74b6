"""The real-documents benchmark's question file and corpus: well-formed, in the repository, licensed; and
its scoring, on the answers a user saw (no model needed)."""

import re
from pathlib import Path

from bench.real_docs.scoring import DOCS, KINDS, Question, check, judge, read_questions, summary

README = Path(__file__).resolve().parent.parent / "bench" / "real_docs" / "README.md"


def test_the_question_file_is_well_formed_and_its_documents_are_in_the_repository():
    questions = read_questions()  # raises, naming each problem, when the file is not well-formed
    assert len(questions) >= 150
    assert {q.kind for q in questions} == set(KINDS), "every kind of document and question is asked"
    assert sum(not q.covered for q in questions) >= 15
    assert all(q.history for q in questions if q.kind == "followup")


def test_a_question_naming_a_missing_document_or_no_answer_is_reported():
    problems = check(
        [
            Question("a", "man-en", "man/en/no-such.1.gz", "?", ("x",)),
            Question("b", "pdf", "pdf/bzip2-manual.pdf", "?", ()),
            Question("b", "uncovered", None, "?", (), covered=False),
        ]
    )
    assert any("no-such.1.gz is not in" in p for p in problems)
    assert any(p.startswith("b: a covered question needs expected answers") for p in problems)
    assert "id b twice" in problems


def test_every_vendored_document_is_listed_with_a_licence_file_that_exists():
    text = README.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `docs/")]
    listed: set[str] = set()
    for row in rows:
        files, _, _, licence = (cell.strip() for cell in row.strip("|").split("|"))
        first, *rest = re.findall(r"`([^`]+)`", files)
        folder = first.rsplit("/", 1)[0]
        listed |= {first.removeprefix("docs/")} | {f"{folder}/{name}".removeprefix("docs/") for name in rest}
        assert (README.parent / licence.strip("`")).is_file(), f"no licence file {licence}"
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*") if p.is_file()}
    assert on_disk == listed, f"not listed: {sorted(on_disk - listed)}; listed, not there: {sorted(listed - on_disk)}"
    assert sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file()) < 3_000_000


def _reply(answer: str, sources: list[str], *, supported: bool = True, finish: str = "stop") -> dict:
    return {
        "answer": answer,
        "sources": [{"source": "tables/services.docx", "text": text} for text in sources],
        "citations": {
            "citations": [{"source": "tables/services.docx", "kind": "attributed"}] if sources else [],
            "sentences": [{"text": answer, "supported": supported}],
        },
        "done": {"finish_reason": finish},
    }


IMAPS = Question("t-1", "docx-table", "tables/services.docx", "Which port does imaps use?", ("993", "993/tcp"))


def test_a_port_inside_a_sentence_is_right_and_another_port_is_wrong_shown_as_supported():
    chunk = "| imaps | 993 | tcp |  | IMAP over SSL |"
    right = judge(IMAPS, _reply("The imaps service uses port 993/tcp [S1].", [chunk]), 1.0)
    assert right.status == "right" and not right.exact and right.answer_in_sources
    wrong = judge(IMAPS, _reply("1080", [chunk]), 1.0)
    assert wrong.status == "wrong" and wrong.shown_supported and wrong.source_rank == 1
    assert summary([right, wrong])["totals"]["wrong_shown_supported"] == 1


def test_an_option_letter_is_told_apart_by_case_where_the_question_says_so():
    q = Question("t-2", "man-zh", "man/zh_CN/ls.1.gz", "ls 用哪个选项根据文件大小排序？", ("-S",), case=True)
    assert judge(q, _reply("-S", []), 1.0).right
    assert not judge(q, _reply("-s", []), 1.0).right


def test_the_fixed_not_in_the_documents_answer_is_a_right_refusal_only_where_nothing_covers_the_question():
    fixed = _reply("The documents do not say.", [], finish="no_sources")
    uncovered = Question("t-3", "uncovered", None, "What is the capital of Australia?", (), covered=False)
    assert judge(uncovered, fixed, 0.1).status == "refused-right"
    assert judge(IMAPS, fixed, 0.1).status == "refused"
    answered = judge(uncovered, _reply("Canberra", ["Canberra is the capital."]), 1.0)
    assert answered.status == "answered" and not answered.right and answered.shown_supported


def test_an_expected_list_needs_every_word_and_chinese_is_matched_by_character():
    q = Question("t-4", "man-zh", "man/zh_CN/shadow.5.gz", "账户过期日期字段为空表示什么？", ("永不过期",))
    assert judge(q, _reply("空字段表示账户永不过期。", []), 1.0).right
    assert not judge(q, _reply("账户过期", []), 1.0).right
    both = Question("t-5", "man-en", "man/en/shadow.5.gz", "?", (("never", "expire"),))
    assert judge(both, _reply("It will never expire.", []), 1.0).right
    assert not judge(both, _reply("It will expire.", []), 1.0).right


def test_a_list_of_numbers_is_no_answer_though_it_holds_the_one_asked_for():
    q = Question("t-7", "man-zh", "man/zh_CN/passwd.5.gz", "/etc/passwd 中用户主目录是第几个字段？", ("6", "六"))
    assert not judge(q, _reply("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", []), 1.0).right
    assert judge(q, _reply("第 6 个字段", []), 1.0).right
    dates = Question("t-8", "man-en", "man/en/shadow.5.gz", "Since which date?", ("1970",))
    assert judge(dates, _reply("Jan 1, 1970 00:00 UTC", []), 1.0).right  # a day and a time besides: no list


def test_a_latin_word_run_into_chinese_is_a_word_of_its_own():
    # OCR of a Chinese page runs an option into the text after it ("--link使用硬链接取代复制"): the
    # option is still there for the answer and for "answer in sources".
    q = Question("t-6", "scan-pdf", "scans/cp.1-zh_CN-scan.pdf", "cp 的哪个选项使用硬链接取代复制？", ("-l", "--link"))
    chunk = "-H 跟随源文件命令行中显式给出的符号链接-1, --link使用硬链接取代复制-L, --dereference总是跟随"
    verdict = judge(q, _reply("--link使用硬链接", [chunk]), 1.0)
    assert verdict.right and verdict.answer_in_sources
    preserve = Question(
        "t-7", "scan-pdf", "scans/cp.1-zh_CN-scan.pdf", "cp 的 -a 选项与什么相同？", ("-dR --preserve=all",)
    )
    assert judge(preserve, _reply("与-dR --preserve=all相同", []), 1.0).right


def test_a_limited_run_asks_every_kind_before_a_second_question_of_any():
    from bench.real_docs.run import pick

    quick = pick(read_questions(), None, len(KINDS))
    assert [q.kind for q in quick] == list(KINDS)
    assert [q.id for q in pick(read_questions(), {"uncovered"}, 3)] == ["uncovered-01", "uncovered-02", "uncovered-03"]
