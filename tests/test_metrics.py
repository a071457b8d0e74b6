"""GET /metrics: a Prometheus scrape after real uploads and answers, parsed with prometheus-client's parser."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rag.core.config import Settings
from tests.chat_helpers import DOCS, ask, changed, serve, upload

pytestmark = pytest.mark.integration


def scrape(url: str, **kwargs) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{url}/metrics", timeout=30, **kwargs)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_requests_answers_retrieval_and_ingestion(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url)
        assert (
            httpx.post(
                f"{url}/v1/chat", json=ask("When was the Eiffel Tower completed?", stream=False), timeout=300
            ).status_code
            == 200
        )
        assert httpx.get(f"{url}/v1/documents/nope", timeout=30).status_code == 404
        seen = scrape(url)

    def value(name: str, **labels: str) -> float:
        return seen[(name, tuple(sorted(labels.items())))]

    assert value("rag_http_requests_total", route="/v1/chat", method="POST", status="200") == 1
    assert value("rag_http_requests_total", route="/v1/documents", method="POST", status="200") == 1
    assert value("rag_http_requests_total", route="/v1/documents/{doc_id}", method="GET", status="404") == 1
    assert value("rag_ingest_documents_total", status="indexed") == len(DOCS)
    assert value("rag_ingest_chunks_total") >= len(DOCS)
    for stage in ("embed", "dense", "lexical", "total"):
        assert value("rag_retrieval_duration_seconds_count", stage=stage) == 1, stage
    assert value("rag_time_to_first_token_seconds_count") == 1
    assert value("rag_generation_tokens_per_second_count") == 1
    assert value("rag_prompt_budget_use_ratio_count") == 1 and 0 < value("rag_prompt_budget_use_ratio_sum") <= 1
    assert value("rag_queue_wait_seconds_count") == 1
    assert value("rag_queue_waiting") == 0 and value("rag_queue_active") == 0
    assert value("rag_queue_rejections_total") == 0
    assert value("rag_completion_tokens_total") > 0


def test_metrics_need_the_api_key_when_one_is_set(backend_settings: Settings):
    with serve(changed(backend_settings, api_key="k3y")) as url:
        assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
        assert ("rag_queue_waiting", ()) in scrape(url, headers={"Authorization": "Bearer k3y"})
