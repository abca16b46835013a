"""workers: the engine each runs (builtin | vllm), so the warm pool keeps workers per engine

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-08 10:00:00.000000

A warm-pool worker prepares one engine at its boot (vLLM's imports are most of a vLLM cold
start) and is assigned only deployments on that engine; a deployment's worker runs its
deployment's. Workers recorded before engines were pooled ran the built-in engine, or were
vLLM workers of a deployment (their deployment's row says which).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # (SQLite adds a column with a constant default in place: no copy of the table)
    op.add_column(
        "workers",
        sa.Column("engine", sa.String(16), nullable=False, server_default="builtin"),
    )
    op.execute(
        "UPDATE workers SET engine = 'vllm' WHERE deployment_id IN "
        "(SELECT id FROM deployments WHERE engine_resolved = 'vllm')"
    )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("engine")
