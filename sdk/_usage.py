"""`client.usage`: what each job used and cost, and totals grouped by one dimension.

    client.usage.list(deployment="demo", limit=20)        # per-job usage records
    client.usage.summary(group_by="phase")                 # [{"key": "busy", "amount": ...}]

Amounts and seconds are decimal strings (`Decimal(row["amount"])`), never floats.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from sdk import _routes as routes
from sdk._base import summary_rows
from sdk._resource import AsyncResource, SyncResource

# What `summary` can group by (docs/sdk.md).
GROUP_BY = ("deployment", "day", "hour", "api_key", "phase")

Time = datetime | str | None


class Usage(SyncResource):
    """`client.usage`: per-job usage records and cost summaries."""

    def list(
        self,
        deployment: str | None = None,
        api_key_id: str | None = None,
        start: Time = None,
        end: Time = None,
        limit: int | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """Usage records (one per job), oldest first, optionally within [start, end)."""
        return self._list(routes.list_usage(deployment, api_key_id, start, end), limit)

    def summary(
        self,
        group_by: str = "deployment",
        deployment: str | None = None,
        start: Time = None,
        end: Time = None,
    ) -> builtins.list[dict[str, Any]]:
        """Totals per group: one row per deployment, day, hour, API key or billing phase.

        Each row has its group under "key" (a deployment name, "2024-05-01", "busy", ...)
        plus decimal strings such as "seconds" and "amount".
        """
        body = self._json(routes.usage_summary(group_by, deployment, start, end))
        return summary_rows(body, group_by)


class AsyncUsage(AsyncResource):
    """`client.usage` of AsyncClient."""

    async def list(
        self,
        deployment: str | None = None,
        api_key_id: str | None = None,
        start: Time = None,
        end: Time = None,
        limit: int | None = None,
    ) -> builtins.list[dict[str, Any]]:
        return await self._list(routes.list_usage(deployment, api_key_id, start, end), limit)

    async def summary(
        self,
        group_by: str = "deployment",
        deployment: str | None = None,
        start: Time = None,
        end: Time = None,
    ) -> builtins.list[dict[str, Any]]:
        body = await self._json(routes.usage_summary(group_by, deployment, start, end))
        return summary_rows(body, group_by)
