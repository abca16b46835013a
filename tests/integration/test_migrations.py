"""Alembic migrations produce exactly the schema the models describe, and can be reversed."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from control_plane.db.migrate import alembic_config, upgrade
from control_plane.db.models import Base


def test_migrations_match_models(database_url: str) -> None:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"


def test_migrations_downgrade_and_upgrade(database_url: str) -> None:
    command.downgrade(alembic_config(database_url), "base")
    upgrade(database_url)
