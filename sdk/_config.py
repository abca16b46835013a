"""Where the SDK finds the platform URL and API key.

Each value is resolved on its own, first hit wins:
    1. the argument given to Client(...) / AsyncClient(...)
    2. the environment: PLATFORM_URL, PLATFORM_API_KEY
    3. the JSON config file at $PLATFORM_CONFIG, else ~/.config/platform/config.json
       ({"url": ..., "api_key": ...}, written by `platform login`)
    4. the default URL http://127.0.0.1:8000 (what `platform up` serves); no API key
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sdk._errors import PlatformError

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True, slots=True)
class Credentials:
    base_url: str  # scheme://host[:port][/prefix], without a trailing slash
    api_key: str | None  # sent as `Authorization: Bearer <api_key>`; None sends no header

    def __repr__(self) -> str:
        # NOTE: the key never appears in a repr, a log line or a traceback.
        return f"Credentials(base_url={self.base_url!r}, api_key={'***' if self.api_key else None})"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """The config file `platform login` writes and the clients read."""
    env = os.environ if env is None else env
    explicit = env.get("PLATFORM_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return Path("~/.config/platform/config.json").expanduser()


def read_config(path: Path) -> dict[str, Any]:
    """The config file's content; {} when it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise PlatformError(f"cannot read the config file {path}: {e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlatformError(f"the config file {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise PlatformError(f"the config file {path} must hold a JSON object")
    return data


def write_config(path: Path, url: str, api_key: str) -> None:
    """Write the config file readable by its owner only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = json.dumps({"url": url, "api_key": api_key}, indent=2) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # NOTE: O_CREAT's mode only applies to a new file; an old one may have been wider.
        os.fchmod(fd, 0o600)
        os.write(fd, data.encode("utf-8"))
    finally:
        os.close(fd)


def resolve_credentials(
    base_url: str | None,
    api_key: str | None,
    env: Mapping[str, str] | None = None,
) -> Credentials:
    """Apply the precedence above; the file is only read when an argument or variable is missing."""
    env = os.environ if env is None else env
    url, url_from = (base_url, "the base_url argument") if base_url else (None, "")
    if url is None and env.get("PLATFORM_URL"):
        url, url_from = env["PLATFORM_URL"], "PLATFORM_URL"
    key = api_key or env.get("PLATFORM_API_KEY") or None
    if url is None or key is None:
        path = config_path(env)
        file = read_config(path)
        if url is None and _str(file.get("url")):
            url, url_from = _str(file.get("url")), str(path)
        key = key or _str(file.get("api_key"))
    url = url or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PlatformError(
            f"invalid platform URL {url!r} (from {url_from}): expected http(s)://host[:port]"
        )
    return Credentials(base_url=url.rstrip("/"), api_key=key)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
