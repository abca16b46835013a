"""a worker's failure reason kept whole: workers.reason up to common.reasons.MAX_REASON_CHARS

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# NOTE: the value of common.reasons.MAX_REASON_CHARS when this revision was written; a
# migration never imports the code it migrates for (the code moves on, the revision must not).
MAX_REASON_CHARS = 4_000


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.alter_column(
            "reason",
            existing_type=sa.String(100),
            type_=sa.String(MAX_REASON_CHARS),
            existing_nullable=True,
        )


def downgrade() -> None:
    # the older column holds 100 characters: longer reasons are cut, as that version cut them
    op.execute("UPDATE workers SET reason = substr(reason, 1, 100) WHERE length(reason) > 100")
    with op.batch_alter_table("workers") as batch:
        batch.alter_column(
            "reason",
            existing_type=sa.String(MAX_REASON_CHARS),
            type_=sa.String(100),
            existing_nullable=True,
        )
