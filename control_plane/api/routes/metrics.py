"""Prometheus: the control plane's own metrics, and where the workers' are.

Platform-wide numbers: only the operator's admin keys may read either (in Prometheus:
`authorization: {credentials: sk_…}`); docs/observability.md lists every family.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from control_plane.api.context import Ctx, Db, Now, Principal
from control_plane.metrics import exposition, snapshot, targets
from control_plane.services.tenants import api_keys

router = APIRouter(tags=["metrics"], include_in_schema=False)


@router.get("/metrics")
def metrics(ctx: Ctx, session: Db, who: Principal, at: Now) -> Response:
    """Prometheus text: the event families (every control-plane process's, in multiprocess
    mode) and the state families, read from SQL and Redis by this process only."""
    api_keys.require_operator(session, who)
    state = snapshot.Fleet(lambda: snapshot.read(session, ctx.redis, at))
    body = exposition.render(state, exposition.multiproc_dir())
    return Response(body, media_type=exposition.CONTENT_TYPE)


@router.get("/metrics/workers")
def worker_targets(ctx: Ctx, session: Db, who: Principal) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: the live workers' own /metrics addresses."""
    api_keys.require_operator(session, who)
    return targets.read(session, ctx.redis)
