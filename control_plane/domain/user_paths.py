"""Internal storage paths shown as the tenant's own `store://` paths; pure.

A tenant's files live at `s3://<store bucket>/tenants/<tenant id>/<path>` (`uris.store_key`),
which the tenant knows as `store://<path>`. A worker's error names what it read, i.e. the
internal path; before a reason reaches the tenant it is rewritten to the name the tenant gave:

    for_tenant("OSError: s3://platform-store/tenants/ten_1/models/x/: no such key",
               "platform-store", "ten_1")
    # "OSError: store://models/x/: no such key"

Only the owning tenant's namespace is rewritten. Another tenant's internal prefix cannot
appear in a reason about this tenant's worker (its assignment names only this tenant's store);
should one ever, it is hidden rather than shown, so no tenant id of another leaks.
"""

from __future__ import annotations

import re

from common.reasons import bounded_reason
from control_plane.domain import uris

OTHER_TENANT = "store://(another tenant's path)/"


def store_paths(text: str, bucket: str, tenant_id: str) -> str:
    """`text` with the tenant's internal store prefix (s3:// URI or bare key after the bucket)
    written as `store://`, and any other tenant's prefix hidden."""
    own = f"s3://{bucket}/{uris.store_key(tenant_id, '')}"
    text = text.replace(own, uris.STORE_SCHEME)
    other = re.compile(rf"s3://{re.escape(bucket)}/tenants/[^/\s]+/")
    return other.sub(OTHER_TENANT, text)


def for_tenant(reason: str, bucket: str, tenant_id: str) -> str:
    """A failure's reason as the tenant reads it: its paths its own, bounded, never cut short."""
    return bounded_reason(store_paths(reason, bucket, tenant_id))


__all__ = ["OTHER_TENANT", "for_tenant", "store_paths"]
