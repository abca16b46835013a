"""Probes: `/healthz` (this process answers: liveness) and `/readyz` (it can reach the
database, Redis and the object store: readiness). Neither needs a key: load balancers and
kubelets call them. `/readyz` names what failed, never why (the log says)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from control_plane.api.context import Ctx
from control_plane.errors import Unavailable
from control_plane.services import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "A dependency is unreachable"}})
def readyz(ctx: Ctx) -> dict[str, Any]:
    checks = readiness.check(ctx.sessions, ctx.redis, ctx.settings)
    named = {name: "ok" if ok else "unreachable" for name, ok in checks.items()}
    if all(checks.values()):
        return {"status": "ready", "checks": named}
    down = ", ".join(name for name, ok in checks.items() if not ok)
    raise Unavailable(f"not ready: {down} unreachable", checks=named)
