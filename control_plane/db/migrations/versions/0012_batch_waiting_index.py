"""a batch's waiting lines in input order (a line's end hands its slot to the next one)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# as control_plane.db.models.BATCH_WAITING at this revision
WAITING = sa.text("batch_id IS NOT NULL AND dispatched_at IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_batch_waiting",
        "jobs",
        ["batch_id", "batch_index"],
        sqlite_where=WAITING,
        postgresql_where=WAITING,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_batch_waiting", table_name="jobs")
