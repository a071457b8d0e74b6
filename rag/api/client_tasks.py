"""Chat clients' own background tasks, recognised and answered at once, without retrieval or the generator.

Open WebUI (and clients built like it) send their housekeeping through the same `/v1/chat/completions` as
the user's questions: a title for the chat, tags, follow-up suggestions, search queries, autocompletion.
Each is one user message that starts `### Task:` and asks for a JSON object (`{ "title": ... }`,
`{ "tags": [...] }`, `{ "follow_ups": [...] }`, `{ "queries": [...] }`, `{ "text": ... }`; newer titles
as plain text), with the chat so far inside `<chat_history>`. Answered as RAG questions they searched the documents, took the one
generation slot ahead of the user's next question (about 10 s on the CPU profile) and came back as
invented text. Here they are answered from the chat history itself, in the JSON asked for: the title is
the first question's opening words, the tags its longest distinct words, the search query the last
question; follow-ups and autocompletion are left empty (the bundled generator cannot write good ones,
and an empty list is what the client shows as nothing).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

TaskKind = Literal["title", "tags", "follow_ups", "queries", "autocomplete", "other"]

TASK_START = re.compile(r"^\s*#{2,3}\s*Task:", re.IGNORECASE)
# The JSON key each task's "### Output" section asks for, in the order they are tried.
OUTPUT_KEYS: tuple[tuple[TaskKind, str], ...] = (
    ("follow_ups", "follow_ups"),
    ("queries", "queries"),
    ("tags", "tags"),
    ("title", "title"),
    ("autocomplete", "text"),
)
HISTORY = re.compile(r"<chat_history>(.*?)</chat_history>", re.DOTALL | re.IGNORECASE)
# What the user wrote, inside a task's prompt: the chat so far, and the text an autocompletion continues,
# each an element opening a line (the task's own words name "`<text>`" mid-sentence).
USERS_TEXT = re.compile(r"^<(chat_history|text)>.*?</\1>", re.DOTALL | re.IGNORECASE | re.MULTILINE)
USER_LINE = re.compile(r"^\s*USER:\s*(.+)$", re.MULTILINE)
TITLE_WORDS = 6
WORD = re.compile(r"[^\W_][\w'’-]*", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be by can could did do does for from had has have how i in is it its me my of on or "
    "our so than that the their them then there these they this to was we were what when where which who "
    "why will with would you your about into over under".split()
)


@dataclass(frozen=True)
class ClientTask:
    kind: TaskKind
    content: str  # the JSON answer, as the client parses it


def _questions(prompt: str) -> list[str]:
    history = HISTORY.search(prompt)
    return [q.strip() for q in USER_LINE.findall(history.group(1) if history else "") if q.strip()]


def _title(questions: list[str]) -> str:
    words = WORD.findall(questions[0]) if questions else []
    if not words and questions:  # a language without spaces: the first characters
        return questions[0][:16]
    return " ".join(words[:TITLE_WORDS]) or "Chat"


def _tags(questions: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for question in questions:
        for word in WORD.findall(question.lower()):
            if word not in STOPWORDS and len(word) > 3:
                seen.setdefault(word, None)
    return sorted(seen, key=len, reverse=True)[:3]


def _answer(kind: TaskKind, questions: list[str], as_json: bool) -> str:
    body: dict[str, object]
    if kind == "title":
        if not as_json:
            return _title(questions)
        body = {"title": _title(questions)}
    elif kind == "tags":
        body = {"tags": _tags(questions)}
    elif kind == "queries":
        body = {"queries": questions[-1:]}
    elif kind == "follow_ups":
        body = {"follow_ups": []}
    elif kind == "autocomplete":
        body = {"text": ""}
    else:
        body = {}
    return json.dumps(body, ensure_ascii=False)


def client_task(last_user_message: str) -> ClientTask | None:
    """The client task this message is, answered; None for a question of the user's."""
    if not TASK_START.match(last_user_message):
        return None
    # The JSON asked for is read from the task's own words, never from the user's text quoted in it (a
    # question naming "tags" is no tags task); from its "### Output" section first, where there is one
    # (autocompletion's ends the prompt, empty).
    template = USERS_TEXT.sub("", last_user_message)
    task, _, output = template.partition("### Output")
    kind: TaskKind = next((k for part in (output, template) for k, key in OUTPUT_KEYS if f'"{key}"' in part), "other")
    as_json = kind != "other"
    if kind == "other" and re.search(r"\btitle\b", task[:300], re.IGNORECASE):
        kind = "title"  # "Return ONLY the title text": the title as plain text
    return ClientTask(kind, _answer(kind, _questions(last_user_message), as_json))
