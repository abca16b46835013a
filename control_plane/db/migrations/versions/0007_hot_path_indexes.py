"""indexes of the hot paths: a tenant's active jobs (quota check on every admission)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 16:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_tenant_status", "jobs", ["tenant_id", "status", "dispatched_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_status", table_name="jobs")
