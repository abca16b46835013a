"""Pydantic shapes at the HTTP edge: the requests tenants send, and the problem document of an
error. The answers are `responses.py`; the worker's internal routes `worker_schemas.py`."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from common.job_input import MAX_CHOICES
from common.job_input import JobInput as ResolvedInput
from control_plane.api import structured_spec
from control_plane.domain import uris
from control_plane.domain.spec import default_of
from control_plane.services.webhooks.signing import WEBHOOK_EVENTS

# NOTE: patterns are applied with `fullmatch`: `match` with `$` also takes a trailing newline.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# A model URI's shape (its scheme, no control characters); domain/uris.py has the whole rule.
MODEL_URI_PATTERN = r"^(store|s3|hf|file)://[^\x00-\x1f\x7f]+$"
MAX_PROMPT_CHARS = 200_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def unicode_text(value: Any) -> Any:
    """Refuse a string that is not Unicode text. JSON can spell a lone surrogate (`"\\ud800"`);
    Python decodes it, but no UTF-8 writer (the answer, Redis, the worker, PostgreSQL) can
    encode it, so it would fail far from here, after the job was stored."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"is not valid Unicode text: character {exc.start} is a lone surrogate "
                f"(U+{ord(value[exc.start]):04X}), which cannot be encoded as UTF-8"
            ) from None
    return value


def _one_line(value: str) -> str:
    found = _CONTROL.search(value)
    if found:
        raise ValueError(
            f"holds a control character (U+{ord(found.group()):04X} at character "
            f"{found.start()}); names, URLs and credentials take printable text only"
        )
    return value


# Every string of a request body is one of these two (tests/integration/abuse checks it):
# Text: prompts, stop sequences, messages: any Unicode text, newlines included.
Text = Annotated[str, BeforeValidator(unicode_text)]
# Line: names, URLs, ids, credentials: Unicode text without control characters (a NUL, CR or
# LF in a URL or a header-bound value would be cut or smuggled further on).
Line = Annotated[str, BeforeValidator(unicode_text), AfterValidator(_one_line)]


class SamplingDefaults(BaseModel):
    """Sampling a deployment may set defaults for (and a call may set); None = unset. The
    meanings are `common.job_input.JobInput`'s."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=5)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1_000_000, description="0 = no limit")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stop: list[Text] | None = Field(None, max_length=8)


class DeploymentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The patterns are documentation (clients and generated tests see the rule); the
    # validators below enforce it, with messages that say what is wrong.
    name: Line = Field(
        description="lowercase letters, digits and '-', at most 63 characters",
        json_schema_extra={"pattern": f"^{NAME_RE.pattern}$"},
    )
    model: Line = Field(
        max_length=2_000,
        description="store://prefix/ (your namespace), s3://bucket/prefix/ (a bucket you "
        "registered credentials for), hf://org/repo[@rev]; file:///path for the operator only",
        json_schema_extra={"pattern": MODEL_URI_PATTERN},
    )
    # Defaults live in the domain's Spec; these shapes only add the bounds.
    accelerator: Line = default_of("accelerator")
    accelerator_count: int = Field(
        default_of("accelerator_count"),
        ge=1,
        le=8,
        description="accelerators per worker; above 1 the model is split over them by vLLM's "
        "tensor parallelism (the built-in engine runs on one)",
    )
    engine: Literal["auto", "builtin", "vllm"] = Field(
        default_of("engine"),
        description="the engine that serves it: builtin (this platform's own), vllm (more "
        "architectures, quantized weights, several accelerators) or auto (builtin where it "
        "can, vllm otherwise); the deployment's engine_resolved and engine_reason say which "
        "and why",
    )
    min_workers: int = Field(default_of("min_workers"), ge=0, le=64)
    max_workers: int = Field(default_of("max_workers"), ge=1, le=64)
    target_concurrency: int = Field(default_of("target_concurrency"), ge=1, le=256)
    scaledown_window_s: float = Field(default_of("scaledown_window_s"), ge=0, le=86_400)
    max_boot_s: float = Field(default_of("max_boot_s"), gt=0, le=3_600)
    cold_penalty_s: float = Field(default_of("cold_penalty_s"), ge=0, le=86_400)
    queue_wait_s: float = Field(default_of("queue_wait_s"), ge=0, le=3_600)
    execution_timeout_s: float = Field(default_of("execution_timeout_s"), gt=0, le=86_400)
    defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)
    tool_parser: Literal["auto", "hermes", "llama3_json"] = Field(
        default_of("tool_parser"),
        description="how tool calls are read from the model's text: auto (from its chat "
        "template), hermes (<tool_call> JSON, Qwen) or llama3_json",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("must be lowercase letters, digits and '-', starting alphanumeric")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        # The one parser of storage URIs; who may read it is checked by the route.
        try:
            uris.parse(v)
        except uris.UriError as exc:
            raise ValueError(exc.reason) from None
        return v

    @model_validator(mode="after")
    def _bounds(self) -> DeploymentSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) exceeds max_workers ({self.max_workers})"
            )
        return self


class JobInput(SamplingDefaults):
    prompt: Text = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    # token id (a decimal string, as JSON keys are) -> bias in [-100, 100]
    logit_bias: dict[str, float] | None = Field(None, max_length=300)
    logprobs: int | None = Field(
        None, ge=0, le=20, description="alternatives per token to return log-probabilities of"
    )
    n: int | None = Field(
        None, ge=1, le=MAX_CHOICES, description="sequences generated from the prompt"
    )
    structured: dict[str, Any] | None = Field(
        None,
        description='what the output must match: {"json": <JSON schema>}, {"regex": "..."}, '
        '{"grammar": "<Lark / EBNF>"} or {"choice": ["a", "b"]}',
    )
    add_special_tokens: bool | None = Field(
        None, description="false: the prompt already holds its special tokens (no BOS added)"
    )

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(t < 0 for t in v):
            raise ValueError("token ids are >= 0")
        return v

    @field_validator("structured")
    @classmethod
    def _structured(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # compiled here (a grammar the worker cannot use is the caller's 422)
        return None if v is None else structured_spec.from_dict(v).to_dict()

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not token.isascii() or not token.isdigit() or len(token) > 9:
                raise ValueError(f"keys are token ids (decimal strings), got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"a bias is in [-100, 100], got {bias} for token {token}")
        return v

    def resolved(self, defaults: dict[str, Any]) -> ResolvedInput:
        """The input with the deployment's defaults, then the platform's, filled in."""
        return ResolvedInput.resolve(self.model_dump(), defaults)


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: JobInput
    stream: bool = False
    wait_s: float | None = Field(None, gt=0)


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: JobInput
    webhook: Line | None = Field(None, max_length=2_000)
    webhook_events: list[Line] = Field(default_factory=lambda: ["completed"])
    ttl_s: float | None = Field(None, gt=0, le=7 * 86_400)
    # Overrides the deployment's execution_timeout_s for this job.
    execution_timeout_s: float | None = Field(None, gt=0, le=86_400)

    @field_validator("webhook_events")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        bad = sorted(set(v) - WEBHOOK_EVENTS)
        if bad:
            raise ValueError(f"unknown events {bad}; allowed: {sorted(WEBHOOK_EVENTS)}")
        return v


# Internal (worker → control plane) shapes.


# Response shapes (documented in the OpenAPI schema; secrets never appear in them).


class FieldError(BaseModel):
    field: str  # dotted path of the offending field ("input.max_tokens")
    message: str  # what is wrong, with the limits


class Problem(BaseModel):
    """RFC 7807 problem details; extra members (limit, job_id, ...) depend on the problem."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldError] | None = None
