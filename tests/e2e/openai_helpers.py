"""What the OpenAI-compatible e2e tests share: a deployment of the demo model of their own on
the session's platform, and the official client pointed at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from sdk import Client


def deployed(platform: dict[str, Any], model: Path, name: str) -> dict[str, Any]:
    """Deploy `model` as `name` (kept warm for the module), and return the platform."""
    Client(base_url=platform["url"], api_key=platform["api_key"]).deployments.create(
        name=name, model=str(model), scaledown_window_s=600
    )
    return platform


def openai_client(platform: dict[str, Any]) -> openai.OpenAI:
    """The `openai` client on the platform's `/v1`: no retries (each call is what is tested)."""
    return openai.OpenAI(
        base_url=platform["url"] + "/v1", api_key=platform["api_key"], max_retries=0, timeout=120
    )
