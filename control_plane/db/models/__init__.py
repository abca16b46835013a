"""SQL records: the source of truth for tenants, deployments, jobs, workers and billing.

The same models run on SQLite (embedded) and PostgreSQL. Schema changes go through Alembic
(`control_plane/db/migrations`). Money is Decimal, stored exactly (see `DecimalText`).

One module per noun (`tenants`, `deployments`, `jobs`, `workers`, `billing`, `webhooks`), all
on one `Base`. NOTE: this package imports and re-exports every mapped class, so importing
`control_plane.db.models` registers all tables in `Base.metadata` (Alembic's autogenerate and
`create_all` need them all) and `from control_plane.db.models import X` works for each of them.
"""

from __future__ import annotations

from control_plane.db.models.base import Base, utcnow
from control_plane.db.models.billing import BILLING_UNALLOCATED, BillingRecord, CostAllocation
from control_plane.db.models.deployments import Deployment, DeploymentVersion
from control_plane.db.models.jobs import BATCH_WAITING, Batch, Job, JobAttempt
from control_plane.db.models.tenants import ApiKey, StorageCredential, Tenant
from control_plane.db.models.webhooks import WebhookDelivery, WebhookEndpoint
from control_plane.db.models.workers import ReconcilerFence, Worker

# Re-exported: the migrations name these types as control_plane.db.models.*.
from control_plane.db.types import DecimalText, UTCDateTime

__all__ = [
    "BATCH_WAITING",
    "BILLING_UNALLOCATED",
    "ApiKey",
    "Base",
    "Batch",
    "BillingRecord",
    "CostAllocation",
    "DecimalText",
    "Deployment",
    "DeploymentVersion",
    "Job",
    "JobAttempt",
    "ReconcilerFence",
    "StorageCredential",
    "Tenant",
    "UTCDateTime",
    "WebhookDelivery",
    "WebhookEndpoint",
    "Worker",
    "utcnow",
]
