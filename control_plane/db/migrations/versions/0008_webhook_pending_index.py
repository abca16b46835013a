"""jobs whose completed webhook is still pending (the reconciler's resend of lost deliveries)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = sa.text("webhook_status = 'pending'")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_webhook_pending",
        "jobs",
        ["webhook_status"],
        sqlite_where=PENDING,
        postgresql_where=PENDING,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_webhook_pending", table_name="jobs")
