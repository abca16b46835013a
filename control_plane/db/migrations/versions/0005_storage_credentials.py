"""storage credentials a tenant registers for its own buckets

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import control_plane.db.models

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "storage_credentials",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("bucket", sa.String(63), nullable=False),
        sa.Column("endpoint_url", sa.String(500), nullable=True),
        sa.Column("region", sa.String(40), nullable=False),
        sa.Column("access_key_id", sa.String(200), nullable=False),
        sa.Column("secret_ciphertext", sa.Text(), nullable=False),
        sa.Column("created_at", control_plane.db.models.UTCDateTime(), nullable=False),
        sa.UniqueConstraint("tenant_id", "bucket", name="uq_storage_cred_bucket"),
    )
    op.create_index("ix_storage_credentials_tenant_id", "storage_credentials", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_storage_credentials_tenant_id", "storage_credentials")
    op.drop_table("storage_credentials")
