"""the autoscaler's service-time read: a deployment's latest finished jobs

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 12:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_deployment_completed", "jobs", ["deployment_id", "completed_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_deployment_completed", table_name="jobs")
