"""Planner backend for any OpenAI-compatible chat completions endpoint.

A separate vLLM server (`python -m vllm.entrypoints.openai.api_server`), a hosted gateway,
anything that speaks `POST {base_url}/chat/completions` with `response_format` of type
`json_schema`. The plan's JSON schema goes with every request, with `strict: true`, and all
`n` samples are asked for in one request. Plain httpx with an explicit timeout; no SDK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from planner.backends.base import Generation, GenerationRequest, sample_seeds
from services.errors import DependencyUnavailable, NotReady
from services.settings import PlannerSettings

log = structlog.get_logger(__name__)

# How long to wait for a TCP connection before calling the endpoint down.
_CONNECT_TIMEOUT_S = 5.0
# Longest error body quoted back in an error message.
_MAX_ERROR_CHARS = 300


class OpenAIBackendError(DependencyUnavailable):
    """The OpenAI-compatible endpoint is unreachable, slow, or answered an error."""

    error_type = "planner_backend_unavailable"


@dataclass
class OpenAIGeneration(Generation):
    """A generation plus each sample's `finish_reason` ("stop", "length", ...)."""

    finish_reasons: list[str] = field(default_factory=list)


class OpenAIBackend:
    name = "openai"

    def __init__(
        self, settings: PlannerSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.base_url = settings.openai_base_url.rstrip("/")
        # Known once `load()` has asked the endpoint; the configured name until then.
        self.model = settings.openai_model or ""
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        key = self.settings.openai_api_key
        if key and key != "EMPTY":
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def load(self) -> None:
        """Open the client and check the endpoint serves the configured (or any) model."""
        timeout = httpx.Timeout(
            self.settings.openai_timeout_s,
            connect=min(_CONNECT_TIMEOUT_S, self.settings.openai_timeout_s),
        )
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=timeout,
            transport=self._transport,
        )
        body = await self._request("GET", "/models")
        data = body.get("data")
        served: list[str] = [
            m["id"]
            for m in (data if isinstance(data, list) else [])
            if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]
        ]
        if not served:
            raise OpenAIBackendError(f"{self.base_url}/models lists no models")
        wanted = self.settings.openai_model
        if wanted:
            if wanted not in served:
                raise OpenAIBackendError(
                    f"model {wanted!r} is not served by {self.base_url}; it serves: "
                    + ", ".join(sorted(served)[:10])
                )
            self.model = wanted
        else:
            self.model = served[0]
        log.info(
            "openai endpoint ready",
            **{
                "event.action": "planner.load",
                "labels.url": self.base_url,
                "labels.model": self.model,
            },
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def generate(self, request: GenerationRequest) -> Generation:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "n": request.n,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_tokens,
        }
        if request.json_schema is not None:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "plan", "schema": request.json_schema, "strict": True},
            }
        if request.stop:
            payload["stop"] = request.stop[:4]  # the OpenAI API takes up to four
        if request.seed is not None:  # one seed for the n samples: the first one's
            payload["seed"] = sample_seeds(request, request.seed)[0]
        body = await self._request("POST", "/chat/completions", json=payload)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise OpenAIBackendError(f"{self.base_url}/chat/completions answered without choices")
        texts: list[str] = []
        reasons: list[str] = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0)):
            message = choice.get("message") or {}
            content = message.get("content")
            # A refusal or an empty message is still a sample: the service's validation
            # rejects it and retries, so it is passed on as text rather than dropped.
            texts.append(content if isinstance(content, str) else "")
            reasons.append(str(choice.get("finish_reason") or "unknown"))
        if cut := reasons.count("length"):
            log.warning(
                "plan samples cut at max_tokens",
                **{
                    "event.action": "planner.generate",
                    "labels.samples": cut,
                    "labels.max_tokens": request.max_tokens,
                },
            )
        usage = body.get("usage") or {}
        return OpenAIGeneration(
            texts=texts,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reasons=reasons,
        )

    async def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if self._client is None:
            raise NotReady("openai backend is not loaded")
        url = f"{self.base_url}{path}"
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise OpenAIBackendError(
                f"{method} {url} timed out after {self.settings.openai_timeout_s} s"
            ) from None
        except httpx.HTTPError as exc:
            raise OpenAIBackendError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}"
            ) from None
        if response.status_code >= 400:
            raise OpenAIBackendError(
                f"{method} {url} answered {response.status_code}: {_error_detail(response)}"
            )
        try:
            body = response.json()
        except json.JSONDecodeError:
            raise OpenAIBackendError(f"{method} {url} answered a body that is not JSON") from None
        if not isinstance(body, dict):
            raise OpenAIBackendError(f"{method} {url} answered JSON that is not an object")
        return body


def _error_detail(response: httpx.Response) -> str:
    """The endpoint's own error message when it sent one, else the start of its body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:_MAX_ERROR_CHARS] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:_MAX_ERROR_CHARS]
        if isinstance(error, str):
            return error[:_MAX_ERROR_CHARS]
    return json.dumps(body)[:_MAX_ERROR_CHARS]
