"""warm pool: a worker may have no deployment yet (pool billing records neither)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import control_plane.db.models

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.alter_column("deployment_id", existing_type=sa.String(40), nullable=True)
        batch_op.add_column(
            sa.Column("assigned_at", control_plane.db.models.UTCDateTime(), nullable=True)
        )
    with op.batch_alter_table("billing_records", schema=None) as batch_op:
        batch_op.alter_column("deployment_id", existing_type=sa.String(40), nullable=True)


def downgrade() -> None:
    # Pool rows have no deployment to go back to: they leave with the column's nullability.
    op.execute("DELETE FROM billing_records WHERE deployment_id IS NULL")
    op.execute("DELETE FROM workers WHERE deployment_id IS NULL")
    with op.batch_alter_table("billing_records", schema=None) as batch_op:
        batch_op.alter_column("deployment_id", existing_type=sa.String(40), nullable=False)
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("assigned_at")
        batch_op.alter_column("deployment_id", existing_type=sa.String(40), nullable=False)
