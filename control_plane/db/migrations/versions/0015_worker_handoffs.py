"""workers that take jobs handed to them at admission (no claim request)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # (SQLite adds a column with a constant default in place: no copy of the table)
    op.add_column(
        "workers",
        sa.Column("takes_handoffs", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("takes_handoffs")
