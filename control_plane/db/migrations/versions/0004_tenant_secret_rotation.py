"""tenant default webhook secret rotation

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import control_plane.db.models

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("previous_webhook_secret", sa.String(100), nullable=True))
        batch.add_column(
            sa.Column(
                "previous_webhook_secret_expires_at",
                control_plane.db.models.UTCDateTime(),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("previous_webhook_secret_expires_at")
        batch.drop_column("previous_webhook_secret")
