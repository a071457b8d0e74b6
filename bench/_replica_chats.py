"""Chats through the balancer (bench/replicas.py `--chats`, `--followups`): how many llama-server ran at
once against its slots, 429s with Retry-After, 5xx; a follow-up sent to another replica than its first
turn, with the prompt tokens llama-server reused (its `cache_n`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx

QUESTIONS = [
    "What did the harbour log list in report {i}?",
    "Which pier was inspected in report {i}, section 3?",
    "When was the lighthouse inspected in report {i}?",
]
MAX_TOKENS = 24


def chat_body(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"messages": messages, "stream": False, "max_tokens": MAX_TOKENS}


async def burst(api: str, llm: str, chats: int) -> dict[str, Any]:
    """`chats` chats at once through the balancer; llama-server's /slots and /metrics polled every 50 ms.
    A slot can only process one request: what shows that no more than its slots were sent to it is
    `requests_deferred` (the requests it holds waiting for a slot) staying 0."""
    peak, done = 0, False
    metrics: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=600) as client:

        async def watch() -> None:
            nonlocal peak
            while not done:
                try:
                    slots = (await client.get(f"{llm}/slots")).json()
                    peak = max(peak, sum(1 for s in slots if s.get("is_processing")))
                    for line in (await client.get(f"{llm}/metrics")).text.splitlines():
                        name, _, value = line.partition(" ")
                        if name in ("llamacpp:requests_processing", "llamacpp:requests_deferred"):
                            key = name.split(":")[1]
                            metrics[key] = max(metrics[key], int(float(value)))
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.05)

        async def chat(i: int) -> tuple[str, str | None, float]:
            question = QUESTIONS[i % len(QUESTIONS)].format(i=i % 8)
            began = time.monotonic()
            try:
                r = await client.post(f"{api}/v1/chat", json=chat_body([{"role": "user", "content": question}]))
            except httpx.HTTPError as exc:
                return type(exc).__name__, None, time.monotonic() - began
            return str(r.status_code), r.headers.get("retry-after"), time.monotonic() - began

        watcher = asyncio.ensure_future(watch())
        started = time.monotonic()
        results = await asyncio.gather(*(chat(i) for i in range(chats)))
        done = True
        await watcher
        total_slots = (await client.get(f"{llm}/props")).json().get("total_slots")
    statuses = Counter(status for status, _, _ in results)
    return {
        "chats": chats,
        "seconds": round(time.monotonic() - started, 1),
        "statuses": dict(statuses),
        "429_without_retry_after": sum(1 for s, ra, _ in results if s == "429" and not ra),
        "5xx": sum(n for s, n in statuses.items() if s.startswith("5")),
        "retry_after": sorted({ra for _, ra, _ in results if ra}),
        "answered_s_max": round(max((t for s, _, t in results if s == "200"), default=0.0), 1),
        "peak_processing_slots": peak,
        "peak_requests_processing": metrics["requests_processing"],
        "peak_requests_deferred": metrics["requests_deferred"],
        "slots": total_slots,
    }


def followups(replicas: list[str], conversations: int) -> list[dict[str, Any]]:
    """Each conversation's first turn through one replica, its follow-up (the history and a second
    question) through the next: the follow-up's prompt tokens and those llama-server reused."""
    rows = []
    with httpx.Client(timeout=600) as client:
        for n in range(conversations):
            first_at, then_at = replicas[n % len(replicas)], replicas[(n + 1) % len(replicas)]
            question = QUESTIONS[0].format(i=n + 1)
            first = client.post(f"{first_at}/v1/chat", json=chat_body([{"role": "user", "content": question}]))
            first.raise_for_status()
            answer = first.json()
            history = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer["answer"]},
                {"role": "user", "content": "And which pier was inspected there?"},
            ]
            second = client.post(f"{then_at}/v1/chat", json=chat_body(history))
            second.raise_for_status()
            follow = second.json()
            first_prompt = int(answer["done"]["usage"].get("prompt_tokens") or 0)
            prompt = int(follow["done"]["usage"].get("prompt_tokens") or 0)
            cached = int(follow["done"].get("cache_n") or 0)
            rows.append(
                {
                    "first_turn_via": first_at,
                    "follow_up_via": then_at,
                    "first_prompt_tokens": first_prompt,
                    "first_cache_n": answer["done"].get("cache_n"),
                    "follow_up_prompt_tokens": prompt,
                    "follow_up_cache_n": cached,
                    "reused_share_of_first_prompt": round(cached / first_prompt, 3) if first_prompt else None,
                    "same_sources": [s["chunk_id"] for s in answer["sources"]][: len(follow["sources"])]
                    == [s["chunk_id"] for s in follow["sources"]][: len(answer["sources"])],
                }
            )
    return rows
