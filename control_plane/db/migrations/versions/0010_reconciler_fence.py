"""the reconciler's fencing token (several control-plane replicas, one leading reconciler)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import control_plane.db.models

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    fence = op.create_table(
        "reconciler_fence",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=True),
        sa.Column("taken_at", control_plane.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    # The one row exists from the start: taking the lease is an UPDATE, which two replicas
    # cannot both win (an INSERT race would need its own handling).
    op.bulk_insert(fence, [{"id": 1, "token": 0}])


def downgrade() -> None:
    op.drop_table("reconciler_fence")
