"""Chat clients' background tasks are told apart from users' questions and answered in the JSON they ask for."""

from __future__ import annotations

import json

from rag.api.client_tasks import client_task
from tests.test_openai_clients import OPEN_WEBUI_FOLLOW_UPS_TASK, OPEN_WEBUI_TITLE_TASK


def test_a_users_question_is_no_task():
    assert client_task("When was the Eiffel Tower completed?") is None
    assert client_task("Explain the ### Task: heading in our style guide") is None


def test_open_webuis_json_tasks_get_their_json():
    title = client_task(OPEN_WEBUI_TITLE_TASK)
    assert title is not None and title.kind == "title"
    assert json.loads(title.content) == {"title": "When was the Eiffel Tower completed"}
    tags = client_task(OPEN_WEBUI_TITLE_TASK.replace('{ "title": "your concise title here" }', '{ "tags": ["a"] }'))
    assert tags is not None and json.loads(tags.content) == {"tags": ["completed", "eiffel", "tower"]}
    follow = client_task(OPEN_WEBUI_FOLLOW_UPS_TASK)
    assert follow is not None and json.loads(follow.content) == {"follow_ups": []}
    queries = client_task(OPEN_WEBUI_TITLE_TASK.replace('{ "title": "your concise title here" }', '{ "queries": [] }'))
    assert queries is not None and json.loads(queries.content) == {"queries": ["When was the Eiffel Tower completed?"]}


def test_a_plain_text_title_task_gets_plain_text():
    plain = OPEN_WEBUI_TITLE_TASK.replace(
        'JSON format: { "title": "your concise title here" }', "Return ONLY the title"
    )
    task = client_task(plain)
    assert task is not None and task.kind == "title" and task.content == "When was the Eiffel Tower completed"


def test_an_unknown_task_gets_an_empty_object():
    task = client_task('### Task:\nRate the mood.\n### Output:\nJSON format: { "mood": 1 }')
    assert task is not None and task.kind == "other" and task.content == "{}"
