# Source of sdk/_webhooks.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.webhooks`: the secret that signs this tenant's webhooks (verify them with
`sdk.webhooks.verify`).

secret = await client.webhooks.secret()  # whsec_...
new_secret = await client.webhooks.rotate_secret()  # the old one signs too for a while
"""

from __future__ import annotations

from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._base import secret_of


class AsyncWebhooks(AsyncResource):
    """`client.webhooks`: the secret that signs this tenant's webhooks."""

    async def secret(self) -> str:
        """The `whsec_...` secret to pass to `sdk.webhooks.verify`."""
        return secret_of(await self._json(routes.webhook_secret()))

    async def rotate_secret(self) -> str:
        """A new signing secret, returned; the old one keeps signing too for the platform's
        rotation overlap (24 h by default), so receivers can switch without losing events."""
        return secret_of(await self._json(routes.rotate_webhook_secret()))
