"""running jobs by worker (the reconciler's overrun check and its busy-to-idle settling)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_running", "jobs", ["worker_id"], sqlite_where=RUNNING, postgresql_where=RUNNING
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_running", table_name="jobs")
