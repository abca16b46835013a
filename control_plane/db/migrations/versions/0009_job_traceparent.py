"""jobs carry the W3C traceparent of the request that created them (OpenTelemetry traces)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("traceparent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # a plain ALTER (SQLite >= 3.35 drops columns): a batch copy would rebuild the table
    op.drop_column("jobs", "traceparent")
