"""The llama-servers `rag up` starts (rag.deploy.llm_servers): how many, on which ports, on which GPU."""

from __future__ import annotations

from rag.core.config import Settings
from rag.deploy.llm_servers import llm_servers


def test_one_url_and_two_servers_take_the_next_port_on_the_cpu() -> None:
    settings = Settings(llm_url="http://127.0.0.1:9001", llm_servers=2)
    servers = llm_servers(settings, on_gpu=False, gpus=["0", "1"])
    assert [(s.name, s.port, s.env) for s in servers] == [("llama-server-1", 9001, {}), ("llama-server-2", 9002, {})]
    assert settings.llm_urls == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_on_gpus_each_server_sees_a_card_of_its_own_and_two_share_one_card() -> None:
    settings = Settings(llm_url="http://127.0.0.1:9001,http://127.0.0.1:9011")
    assert [s.env for s in llm_servers(settings, on_gpu=True, gpus=["0", "1"])] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    assert [s.env for s in llm_servers(settings, on_gpu=True, gpus=["3"])] == [{"CUDA_VISIBLE_DEVICES": "3"}] * 2


def test_one_server_keeps_its_name_and_what_the_host_shows_it() -> None:
    (server,) = llm_servers(Settings(), on_gpu=True, gpus=["0", "1"])
    assert (server.name, server.port, server.env) == ("llama-server", 8081, {})
