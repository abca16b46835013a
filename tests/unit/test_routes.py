"""The API's routers may be included in any order (app.py puts the hot ones first): no path
and method is answered by routes of two of them, so the order decides nothing but speed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import Match

from control_plane.api.app import create_app
from control_plane.settings import Settings


def concrete(path: str) -> str:
    """A path the template matches: each parameter a plain value."""
    return re.sub(r"\{[^}]+\}", "x1", path)


def routes_of(route: Any) -> list[APIRoute]:
    """The API routes under an entry of the app's table (an included router: its own)."""
    router = getattr(route, "original_router", None)  # FastAPI's included routers
    if router is not None:
        return [leaf for r in router.routes for leaf in routes_of(r)]
    return [route] if isinstance(route, APIRoute) else []


def test_every_route_is_claimed_by_one_router_only(tmp_path: Path) -> None:
    # Building the app connects to nothing: the URLs are never used here.
    database_url = f"sqlite:///{tmp_path / 'unused.db'}"
    app = create_app(Settings(database_url=database_url, redis_url="redis://127.0.0.1:1"))
    top = app.router.routes
    leaves = [leaf for r in top for leaf in routes_of(r)]
    assert any(r.path == "/internal/jobs/claim" for r in leaves)
    assert any(r.path == "/v1/deployments/{name}/run" for r in leaves)
    checked = 0
    for route in leaves:
        for method in sorted(route.methods):
            scope = {"type": "http", "path": concrete(route.path), "method": method}
            scope.update(root_path="", headers=[], query_string=b"")
            claimed = [r for r in top if r.matches(dict(scope))[0] == Match.FULL]
            assert len(claimed) == 1, (method, route.path, claimed)
            checked += 1
    assert checked >= 40
