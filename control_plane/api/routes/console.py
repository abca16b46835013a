"""The web console at `/console`: one HTML page, a few small ES modules and one stylesheet
(`api/console/`).

The files hold no data and need no key: the page asks for an API key, keeps it in the tab's
sessionStorage and calls the JSON API with `Authorization: Bearer`, so it sees exactly what
that key may read. Every answer carries a Content-Security-Policy that allows scripts, styles
and requests from this origin only (no inline script, no framing, no form submission: a key
typed into the form can never travel in a URL, even with the script blocked).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Response

from control_plane.errors import NotFound

router = APIRouter(include_in_schema=False)

STATIC_DIR = Path(__file__).resolve().parent.parent / "console"
# console.js is the entry point (sign-in, polling, routing); it imports the other modules
MODULES = (
    "console.js",
    "session.js",
    "dom.js",
    "charts.js",
    "deployments.js",
    "jobs.js",
    "job.js",
    "usage.js",
    "keys.js",
    "playground.js",
    "actions.js",
    "deploy_actions.js",
    "url.js",
)
# name → media type; nothing else under /console/static is served (no path from the URL
# reaches the filesystem).
ASSETS = {
    **dict.fromkeys(MODULES, "text/javascript; charset=utf-8"),
    "console.css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # small files: always revalidated, so an upgraded control plane serves its own script
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


@router.get("/console")
@router.get("/console/")
def page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console/static/{name}")
def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no console file {name!r}")
    return Response(_read(name), media_type=media_type, headers=HEADERS)
