"""The worker's JSON-over-HTTP client refuses what it cannot speak before it connects; its
requests against a real HTTP/1.1 server: tests/integration/test_json_http.py."""

from __future__ import annotations

import pytest

from worker.runtime.json_http import JsonHttp


def test_only_http_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="not an http"):
        JsonHttp("redis://127.0.0.1:6379", {}, timeout_s=1)
