"""Alembic migrations, run down to nothing and up again, build exactly the schema the SQLAlchemy
models describe: Alembic's autogenerate compares the live database with the models' metadata
(tables, columns and their types, nullability, server defaults, indexes, unique and foreign
keys), on SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from control_plane.db.migrate import alembic_config, upgrade
from control_plane.db.models import Base


def schema_diff(database_url: str) -> list[Any]:
    """What autogenerate would write in a new migration: [] when the schema is the models'."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def table_names(database_url: str) -> set[str]:
    engine = create_engine(database_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_down_to_base_and_up_to_head_builds_the_models_schema(database_url: str) -> None:
    # `database_url` is migrated to head already: every downgrade runs, then every upgrade
    command.downgrade(alembic_config(database_url), "base")
    assert table_names(database_url) <= {"alembic_version"}, "downgrade base left tables"
    upgrade(database_url)
    assert table_names(database_url) >= set(Base.metadata.tables)
    diff = schema_diff(database_url)
    assert diff == [], "models and migrations disagree:\n" + "\n".join(map(str, diff))
