"""`platform-entrypoint migrate`: bring the database to the newest schema, then make sure the
operator's tenant and its bootstrap admin key exist (when BOOTSTRAP_ADMIN_KEY is set).

Run once per install or upgrade before the new pods start (the Helm chart's pre-install /
pre-upgrade Job, compose's `migrate` service), so API replicas never race on DDL. Both steps are
idempotent: a retried Job changes nothing the first run did.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from control_plane.db.migrate import upgrade
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.tenants.api_keys import bootstrap, well_formed
from control_plane.settings import Settings


def main() -> int:
    settings = Settings()
    # Not a PLATFORM_ setting: only this one-shot step reads it, never a long-running process.
    admin_key = os.environ.get("BOOTSTRAP_ADMIN_KEY", "")
    if admin_key and not well_formed(admin_key):
        # refused before the schema changes: a failed Job leaves nothing half done
        print(
            "BOOTSTRAP_ADMIN_KEY is not a platform API key (pk_<12 hex>_<secret>); make one "
            "with: python -c 'from control_plane.services.tenants.api_keys import generate_key; "
            "print(generate_key()[0])'",
            file=sys.stderr,
        )
        return 2
    upgrade(settings.database_url)
    print("database at the newest schema", flush=True)
    if admin_key:
        engine = make_engine(settings.database_url)
        with make_sessionmaker(engine)() as session:
            tenant_id = bootstrap(session, admin_key, datetime.now(UTC))
            session.commit()
        engine.dispose()
        print(f"bootstrap admin key present (tenant {tenant_id})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
