"""Chat clients' background tasks are told apart from users' questions and answered in the JSON they ask for."""

from __future__ import annotations

import json
from pathlib import Path

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


def recorded_prompt(name: str) -> str:
    """A task prompt Open WebUI 0.12.4 sent (tests/data/open-webui-0.12.4/)."""
    body = json.loads((Path(__file__).parent / "data" / "open-webui-0.12.4" / f"{name}.json").read_text())["body"]
    return str(body["messages"][-1]["content"])


def test_open_webui_0_12_4s_own_task_prompts_are_recognised():
    kinds = {name: client_task(recorded_prompt(name)) for name in ("title-task", "tags-task", "follow-ups-task")}
    assert {name: task.kind for name, task in kinds.items() if task} == {
        "title-task": "title",
        "tags-task": "tags",
        "follow-ups-task": "follow_ups",
    }
    assert client_task(recorded_prompt("chat-stream")) is None


def test_a_question_quoting_another_tasks_key_does_not_change_the_task():
    # The user's question, inside the title prompt's <chat_history>, names "tags": still a title task.
    task = client_task(recorded_prompt("title-task-quoting-tags"))
    assert task is not None and task.kind == "title"
    assert json.loads(task.content) == {"title": "When are staff badges renewed and"}


def test_an_autocompletion_whose_output_heading_ends_the_prompt_gets_its_text():
    prompt = (
        "### Task:\nYou are an autocompletion system. Continue the text in `<text>`.\n"
        '### **Output Rules**:\n- Respond only in JSON format: `{ "text": "<your_completion>" }`.\n'
        "### Context:\n<chat_history>\nUSER: hi\n</chat_history>\n"
        '<type>General</type>\n<text>Give me the "title" of</text>\n#### Output:\n'
    )
    task = client_task(prompt)
    assert task is not None and task.kind == "autocomplete" and json.loads(task.content) == {"text": ""}
