"""The control plane's secrets in the chart: the bootstrap admin key made by the chart itself
(no package on the operator's machine), installed by the migration Job, read back with kubectl."""

from __future__ import annotations

import base64

from control_plane.services.tenants.api_keys import well_formed
from tests.infra.chart import RELEASE, containers, env_of, find, objects


def test_the_chart_can_generate_the_bootstrap_admin_key() -> None:
    """No package needed on the operator's machine: the chart makes a well-formed key, the
    migration Job installs it, and it is read back with kubectl (NOTES)."""
    assert not [o for o in objects() if o["metadata"]["name"] == f"{RELEASE}-admin-key"]
    objs = objects({"secrets": {"generateAdminKey": True}})
    secret = find(objs, "Secret", f"{RELEASE}-admin-key")
    key = base64.b64decode(secret["data"]["BOOTSTRAP_ADMIN_KEY"]).decode()
    assert well_formed(key) and len(key.split("_")[1]) == 12
    job = find(objs, "Job", f"{RELEASE}-migrate")
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    assert "hook-succeeded" not in secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    ref = env_of(next(containers(job)))["BOOTSTRAP_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == f"{RELEASE}-admin-key"
    # a key given in the values wins over generating one
    given = objects({"secrets": {"generateAdminKey": True, "bootstrapAdminKey": "pk_a_b"}})
    assert not [o for o in given if o["metadata"]["name"] == f"{RELEASE}-admin-key"]
