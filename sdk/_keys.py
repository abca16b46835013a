"""`client.keys`: this tenant's API keys (the caller's key needs the `admin` scope).

key = client.keys.create(name="ci", scopes=["run", "read"])
print(key.key)                 # the secret: shown once, stored hashed by the platform
client.keys.revoke(key.id)     # refused from the next request on
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from sdk import _routes as routes
from sdk._models import ApiKey
from sdk._resource import AsyncResource, SyncResource

# The scopes a key can hold (docs/api.md); a new key gets ["run", "read"] unless told.
SCOPES = ("admin", "deploy", "run", "read")


class Keys(SyncResource):
    """`client.keys`: create, list and revoke API keys."""

    def create(self, name: str = "", scopes: Sequence[str] | None = None) -> ApiKey:
        """A new key; its secret is `.key`, in this answer only. Never retried once sent."""
        return ApiKey(self._object(routes.create_key(name, scopes)))

    def list(self) -> builtins.list[ApiKey]:
        """Every key of the tenant, revoked ones included (never their secrets)."""
        return [ApiKey(raw) for raw in self._list(routes.list_keys(), None)]

    def revoke(self, key_id: str) -> None:
        """Revoke a key by its id; revoking twice is harmless."""
        self._json(routes.revoke_key(key_id))


class AsyncKeys(AsyncResource):
    """`client.keys` of AsyncClient."""

    async def create(self, name: str = "", scopes: Sequence[str] | None = None) -> ApiKey:
        return ApiKey(await self._object(routes.create_key(name, scopes)))

    async def list(self) -> builtins.list[ApiKey]:
        return [ApiKey(raw) for raw in await self._list(routes.list_keys(), None)]

    async def revoke(self, key_id: str) -> None:
        await self._json(routes.revoke_key(key_id))
