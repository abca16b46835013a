# Source of sdk/_usage.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.usage`: what each job used and cost, and totals grouped by one dimension.

    await client.usage.list(deployment="demo", limit=20)  # per-job usage records
    await client.usage.summary(group_by="phase")  # [{"key": "busy", "amount": ...}]

Amounts and seconds are decimal strings (`Decimal(row["amount"])`), never floats.
"""

from __future__ import annotations

import builtins
from typing import Any

from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._base import summary_rows
from sdk._routes import Time


class AsyncUsage(AsyncResource):
    """`client.usage`: per-job usage records and cost summaries.

    Example:
        for row in await client.usage.summary(group_by="day", since="2024-05-01T00:00:00Z"):
            print(row["key"], row["amount"])
    """

    async def list(
        self,
        deployment: str | None = None,
        since: Time = None,
        until: Time = None,
        limit: int | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """One record per job (created in [since, until)): queue_s, boot_wait_s, execution_s,
        billed_seconds, tokens, the workers that served it, and its `cost`."""
        return await self._list(routes.list_usage(deployment, since, until), limit)

    async def summary(
        self, group_by: str = "deployment", since: Time = None, until: Time = None
    ) -> builtins.list[dict[str, Any]]:
        """Billed seconds and cost per group: deployment, day, hour, api_key or phase.

        Each row has its group under "key" (a deployment name, "2024-05-01", "busy", or None
        for cost no API key caused) plus "seconds" and "amount" decimal strings.
        """
        body = await self._json(routes.usage_summary(group_by, since, until))
        return summary_rows(body, group_by)
