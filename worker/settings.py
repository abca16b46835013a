"""Settings of one worker process (env prefix `PLATFORM_`); identity comes from the command line."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLATFORM_", frozen=True, extra="ignore")

    # Where the control plane's /internal endpoints are.
    internal_url: str = "http://127.0.0.1:8000"
    worker_token: SecretStr = SecretStr("")
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Torch intra-op threads (0: torch's default).
    worker_threads: int = Field(1, ge=0)
    # Seconds between cancel-flag checks while generating.
    cancel_poll_s: float = Field(0.2, gt=0)
