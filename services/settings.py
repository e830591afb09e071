"""Settings for each service, read from the environment (and `.env`) by pydantic-settings.

One class per service, each with its own prefix (`PLANNER_`, `ORCH_`, `VERIFIER_`).
Timeouts carry their unit in the name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.schemas import MAX_REPLANS, ReplanReason

PLACEHOLDER_SECRETS = {"changeme", "change-me", "secret", "password", "xxx", "todo", "test"}


def default_cache_dir() -> Path:
    """Where pulled models and built tool environments live: outside the repository."""
    if explicit := os.environ.get("REASON_CACHE_DIR"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reason"


@dataclass(frozen=True)
class HttpLimits:
    """What the app factory's middleware enforces on every request."""

    max_body_bytes: int = 1_000_000
    max_header_bytes: int = 16_384
    body_read_timeout_s: float = 10.0
    max_in_flight: int = 128


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    log_dir: Path = Path("logs")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    # The HTTP front (services.app.TraceMiddleware, and services.serve for uvicorn):
    # total bytes of a request's header names and values; more is refused with 431.
    max_header_bytes: int = Field(default=16_384, ge=1024)
    # Time from the request's headers to the last byte of its body; past it, 408.
    body_read_timeout_s: float = Field(default=10.0, gt=0)
    # Time a connection may take to send a request's line and headers (from connecting,
    # or from sending its first byte); past it the connection is closed. services.serve.
    header_read_timeout_s: float = Field(default=10.0, gt=0)
    # Requests in flight at once (health, readiness and metrics probes not counted);
    # past it, 503 overloaded with Retry-After.
    max_in_flight: int = Field(default=128, ge=1)
    # uvicorn's own backstop (services.serve): open connections plus running requests.
    max_connections: int = Field(default=1024, ge=1)
    keep_alive_timeout_s: int = Field(default=5, ge=1)

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            max_body_bytes=self.max_body_bytes,
            max_header_bytes=self.max_header_bytes,
            body_read_timeout_s=self.body_read_timeout_s,
            max_in_flight=self.max_in_flight,
        )


class PlannerSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="PLANNER_", env_file=".env", extra="ignore")

    port: int = 8001
    backend: Literal["scripted", "llamacpp", "vllm", "openai"] = "scripted"
    # Scripted backend only: JSON file mapping a question to the plan(s) to return.
    script_path: Path | None = None
    # Catalog name (see services.catalog) or a path to a model file/directory. The
    # embedded default is the 1.5B coder model; `qwen2.5-coder-0.5b-instruct` is the one
    # for small machines (a third of the memory and decode time, far fewer right answers:
    # docs/eval).
    model: str = "qwen2.5-coder-1.5b-instruct"
    model_path: Path | None = None
    # A LoRA adapter for the model (services.lora's directory layout: what
    # training.train_planner writes and training.gguf_lora converts). llama.cpp loads its
    # adapter.gguf, vLLM its PEFT weights; plans are then reported under the model's name
    # with the adapter's tag. None: the base model.
    lora: Path | None = None
    # The adapter's sha256 (of its PEFT weights) an operator pins; None: not pinned.
    lora_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    # How strongly the adapter's update is applied (1.0: as trained).
    lora_scale: float = Field(default=1.0, gt=0, le=4)
    temperature: float = Field(default=0.3, ge=0, le=2)
    top_p: float = Field(default=0.85, gt=0, le=1)
    max_tokens: int = Field(default=512, ge=32, le=4096)
    max_attempts: int = Field(default=3, ge=1, le=8)
    # How the model writes its plan (planner.prompting): `json` under the grammar with a
    # one-sentence `reasoning`, `reasoning` with a longer one, `draft` free thinking and a
    # program first, turned into the plan by the planner. docs/benchmarks/plan_format.md
    plan_format: Literal["json", "reasoning", "draft"] = "draft"
    # How many of the prompt's worked examples (planner/prompts/fewshot.jsonl) the plan
    # prompt shows, in file order. docs/benchmarks/plan_format.md, "How many worked
    # examples".
    few_shot: int = Field(default=8, ge=0, le=8)
    # Evaluate the plan prompt's prefix once at startup, before /readyz says ready, on
    # backends that cache prefixes (llama.cpp, vLLM): the first request then does not pay
    # for it (the longest part of a first plan on a small CPU).
    warm_up: bool = True
    seed: int = 0
    n_ctx: int = Field(default=4096, ge=512)
    # llama.cpp only: threads for one-token steps (None: one core fewer than the machine
    # has) and for steps of several tokens, prefill and batched decode (None: every core;
    # docs/benchmarks/planner.md). llama.cpp picks between them per `llama_decode`.
    n_threads: int | None = Field(default=None, ge=1)
    n_threads_batch: int | None = Field(default=None, ge=1)
    # llama.cpp only: how decoding is held to the plan schema. `xgrammar` (the engine vLLM
    # uses) masks logits per step from a precompiled automaton; `gbnf` is llama.cpp's own
    # grammar sampler, which checks the whole vocabulary at every token (slower).
    grammar_engine: Literal["xgrammar", "gbnf"] = "xgrammar"
    # llama.cpp only: ggml's extra weight buffers (AMX tiles, CPU repacking). `auto` turns
    # them off on CPUs with AMX, where ggml's AMX matmul segfaults on the first decode
    # (ggml-org/llama.cpp#20824, seen with llama-cpp-python 0.3.36 on a Sapphire Rapids
    # Xeon); `on` and `off` force it.
    extra_buffers: Literal["auto", "on", "off"] = "auto"
    # llama.cpp only: sequences decoded together (the n samples of every request in
    # flight; a request joins the running batch between two tokens). 1 decodes one
    # sequence at a time, still through the prefix cache.
    max_batch: int = Field(default=8, ge=1, le=64)
    # llama.cpp only: prompt prefixes kept evaluated in the cache (the plan prompt and the
    # chain-of-thought prompt of /solve are both in use when /reason votes over plans
    # and prose); each slot past the first adds 2,048 cells to the cache.
    prefix_slots: int = Field(default=2, ge=1, le=8)
    # llama.cpp only: requests waiting for room in the batch; past it, 503 overloaded
    # with Retry-After.
    max_queued: int = Field(default=32, ge=0, le=4096)
    # vLLM (production: AWQ Phi-3.5-mini on one GPU)
    quantization: str | None = "awq"
    dtype: str = "auto"
    max_model_len: int = Field(default=4096, ge=256, le=4096)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    # OpenAI-compatible endpoint
    openai_base_url: str = "http://127.0.0.1:8100/v1"
    openai_api_key: str = "EMPTY"
    openai_model: str | None = None
    openai_timeout_s: float = Field(default=60.0, gt=0)


class VerifierSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="VERIFIER_", env_file=".env", extra="ignore")

    port: int = 8002
    backend: Literal["scripted", "model"] = "scripted"
    # Scripted backend only: JSON file mapping a statement to [verdict, confidence].
    script_path: Path | None = None
    # Catalog name or local directory of the base causal LM. `qwen2.5-coder-0.5b-instruct`
    # brings the adapter trained on the pipeline's own plans: a better judge of plan claims
    # but, on served answers, no signal beyond the plans' agreement, so the shipped
    # answer calibrator is fitted with the default's scores (docs/eval/dev, 2026-12-07).
    base_model: str = "smollm2-135m-instruct"
    adapter_dir: Path | None = None
    # Model backend only: what runs the model. `transformers`: the base model's
    # safetensors in float32 (float16 on a GPU) with the PEFT adapter merged.
    # `llamacpp`: the catalog model's GGUF with the adapter's `adapter.gguf`
    # (training.gguf_lora) and `calibration-llamacpp.json` (verifier.backends.llamacpp).
    # `auto`: llamacpp for a catalog model on the CPU whose adapter has an adapter.gguf
    # (half the latency, docs/benchmarks/verifier.md), transformers otherwise (a model
    # directory, a GPU, an adapter never converted): verifier.backends.resolve_runtime.
    runtime: Literal["auto", "transformers", "llamacpp"] = "auto"
    # llamacpp runtime only: the tensor type it runs the catalog model in. `auto`: bf16
    # on a CPU with bfloat16 dot products (the trained-on weights to within bf16
    # rounding, and the fastest type measured there), q8_0 elsewhere; `source`: the
    # catalog file as pulled. Converted once (services.catalog.ensure_gguf_type).
    gguf_type: Literal["auto", "source", "bf16", "q8_0"] = "auto"
    # CPU threads the model runs on; unset = all cores on llamacpp, at most 4 on
    # transformers. 1 leaves the other cores to a planner on the same machine.
    n_threads: int | None = Field(default=None, ge=1)
    device: str = "cpu"
    max_input_tokens: int = Field(default=512, ge=32)
    threshold: float = Field(default=0.5, ge=0, le=1)


class OrchestratorSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="ORCH_", env_file=".env", extra="ignore")

    port: int = 8000
    planner_url: str = "http://127.0.0.1:8001"
    verifier_url: str = "http://127.0.0.1:8002"
    connect_timeout_s: float = Field(default=1.0, gt=0)
    # Redis for the answer and tool caches; unset = an in-process TTL cache.
    redis_url: str | None = None
    redis_timeout_s: float = Field(default=0.25, gt=0)
    cache_ttl_s: int = Field(default=300, ge=1)
    cache_max_entries: int = Field(default=10_000, ge=1)
    # PostgreSQL DSN of the read-only SQL role; unset = the shipped SQLite sample data,
    # in `sqlite_path` (unset = orchestrator.provisioning.default_sqlite_path, under the
    # cache directory), built from the seed when the file is missing.
    database_url: str | None = None
    sqlite_path: Path | None = None
    max_replans: int = Field(default=2, ge=0, le=MAX_REPLANS)
    # Why a round is replanned (orchestrator.service): its plans gave no answer
    # (`no_answer`), the answer is served as rejected (`rejected`), fewer than half of the
    # round's plans agree with it (`low_agreement`). As JSON: ["no_answer", "rejected"].
    # Only `no_answer` by default: replanning rejected answers cost the 0.5B pipeline 3x
    # the latency for 0.5 points on GSM8K test (docs/eval), and the verifier rejects right
    # answers as often as wrong ones on the dev split (docs/eval/dev).
    replan_on: list[ReplanReason] = ["no_answer"]
    # API keys -> tenant, as JSON: {"key": "tenant"}. Empty = no auth, tenant "default".
    api_keys: dict[str, str] = Field(default_factory=dict)
    # Per tenant (with no API keys: every caller together is the one tenant "default"):
    # /reason and /tools requests in flight at once; past it, 429 with Retry-After.
    tenant_max_in_flight: int = Field(default=32, ge=1)
    # Per tenant: sandbox jobs at once (python steps, and steps whose fallback is python);
    # the tenant's further steps wait for one of its own slots. Unset = half the sandbox
    # workers (at least 1), so no tenant can occupy every worker.
    tenant_sandbox_jobs: int | None = Field(default=None, ge=1)
    # Per /reason request: tool calls (steps run) over all its plans and replanning
    # rounds; the steps past it are skipped with an error and the answer degrades.
    max_tool_calls_per_request: int = Field(default=32, ge=1)
    # Each tool's timeout and tool-cache lifetime, read by orchestrator.tools.build_registry
    # (a step never runs past its request's deadline either). The sql and lookup tools
    # share the I/O timeout; calc is not cached (it answers in well under a millisecond).
    io_tool_timeout_s: float = Field(default=0.8, gt=0)
    python_timeout_s: float = Field(default=5.0, gt=0)
    calc_timeout_s: float = Field(default=1.0, gt=0)
    sql_cache_ttl_s: float = Field(default=60, gt=0)
    lookup_cache_ttl_s: float = Field(default=3600, gt=0)
    # The answer-confidence calibrator (orchestrator.confidence), for every planner model;
    # unset = the artifacts shipped in orchestrator/calibration/, each request's confidence
    # from the one fitted for the model that planned it (the embedded default's for others).
    confidence_calibrator: Path | None = None
    # Trace lookup (`GET /traces/{trace_id}`, the console's trace view; orchestrator.traces):
    # from Elasticsearch when `trace_es_url` is set (credentials may be in the URL, or an
    # encoded API key in `trace_es_api_key`), else from the services' log files in
    # `trace_log_dir` (unset = `log_dir`: `reason serve` has all three services write
    # there). At most `trace_max_lines` lines of a trace are shown, the earliest. A scan
    # of the log files (waiting for its turn included: two run at once) stops after
    # `trace_scan_timeout_s` seconds, a 503.
    trace_es_url: SecretStr | None = None
    trace_es_index: str = "reason-logs-*"
    trace_es_api_key: SecretStr | None = None
    trace_es_timeout_s: float = Field(default=5.0, gt=0, le=60)
    trace_log_dir: Path | None = None
    trace_scan_timeout_s: float = Field(default=10.0, gt=0, le=120)
    trace_max_lines: int = Field(default=5000, ge=1, le=9999)
    sandbox_workers: int = Field(default=2, ge=1, le=32)
    sandbox_memory_mb: int = Field(default=256, ge=64)
    # auto | netns | seccomp | none — see orchestrator/sandbox/README.md
    sandbox_network_isolation: Literal["auto", "netns", "seccomp", "none"] = "auto"

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            return json.loads(value) if value else {}
        return value

    @model_validator(mode="after")
    def _no_placeholder_keys(self) -> OrchestratorSettings:
        for key in self.api_keys:
            if key.lower() in PLACEHOLDER_SECRETS or len(key) < 16:
                raise ValueError(
                    "ORCH_API_KEYS holds a placeholder or short key; use at least 16 random "
                    "characters, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`"
                )
        return self

    def sandbox_jobs_per_tenant(self) -> int:
        return self.tenant_sandbox_jobs or max(1, self.sandbox_workers // 2)
