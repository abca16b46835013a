"""the reconciler's billing allocation: the busy segments waiting, a worker's recent attempts

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# as control_plane.db.models.BILLING_UNALLOCATED at this revision
UNALLOCATED = sa.text("phase = 'busy' AND NOT allocated")


def upgrade() -> None:
    op.create_index(
        "ix_billing_unallocated",
        "billing_records",
        ["id"],
        sqlite_where=UNALLOCATED,
        postgresql_where=UNALLOCATED,
    )
    op.create_index("ix_job_attempts_worker_ended", "job_attempts", ["worker_id", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_job_attempts_worker_ended", table_name="job_attempts")
    op.drop_index("ix_billing_unallocated", table_name="billing_records")
