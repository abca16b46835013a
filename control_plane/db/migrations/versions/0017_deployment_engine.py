"""deployments: the engine the spec resolved to (builtin | vllm) and why

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 10:00:00.000000

The engine asked for is a spec field (`engine` in the spec's JSON, with the others); what it
resolved to at deploy time is the row's, as the worker's assignment reads it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# NOTE: the value of common.reasons.MAX_REASON_CHARS when this revision was written; a
# migration never imports the code it migrates for.
MAX_REASON_CHARS = 4_000
# Deployments made before engines were chosen ran on the built-in engine; they still do.
EARLIER_REASON = "deployed before engines were chosen: the built-in engine"


def upgrade() -> None:
    # (SQLite adds a column with a constant default in place: no copy of the table)
    op.add_column(
        "deployments",
        sa.Column("engine_resolved", sa.String(16), nullable=False, server_default="builtin"),
    )
    op.add_column(
        "deployments",
        sa.Column(
            "engine_reason",
            sa.String(MAX_REASON_CHARS),
            nullable=False,
            server_default=EARLIER_REASON,
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("engine_reason")
        batch.drop_column("engine_resolved")
