"""What a tenant may read, and with which credentials (DESIGN.md §11, docs/security.md).

Every URI a tenant supplies goes through `resolve` before the platform acts on it:

- `store://path`: the tenant's own namespace, `s3://<store bucket>/tenants/<tenant>/path`,
  read with the platform's credentials (nobody else's namespace can be spelled);
- `s3://bucket/key`: only a bucket the tenant registered credentials for, read with those;
  the tenant's own batch results in the results bucket, with the platform's;
- `file://` and host paths: the operator's tenant only, and only with
  `PLATFORM_ALLOW_HOST_PATHS`;
- `hf://`: the public Hub, anonymously (the platform's own Hub token is the operator's).

The decision depends on the URI and the tenant's registrations only, never on whether the
object exists, so a refusal tells nothing about other tenants' objects. Reads that do touch
storage (`read_object`) answer a missing and a forbidden object with the same text.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.protocol import CREDENTIAL_ENV
from control_plane.db.models import StorageCredential, Tenant
from control_plane.domain import uris
from control_plane.domain.ids import new_id
from control_plane.errors import Conflict, InvalidRequest, NotFound
from control_plane.services.storage import secrets_box
from control_plane.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_REGION = re.compile(r"^[a-z]{2}(-[a-z0-9]+){1,3}$")


@dataclass(frozen=True, slots=True)
class Access:
    """How the platform reads what a tenant named."""

    location: uris.Location  # what the tenant named (its canonical spelling is `.uri`)
    uri: str  # what is read: s3://bucket/key, file:///path or hf://repo[@rev]
    endpoint_url: str | None  # S3 endpoint; None: AWS itself
    region: str
    # The tenant's registered key pair; None: the platform's own (from the environment).
    key_pair: tuple[str, str] | None
    hub_token: bool  # whether the platform's Hub token may be used (the operator's reads)
    # Where workers reach `endpoint_url` when their network path differs from the control
    # plane's (PLATFORM_WORKER_S3_ENDPOINT_URL, for the platform's endpoint); None: there.
    worker_endpoint_url: str | None = None

    def child(self, name: str) -> Access:
        """The object `name` inside this prefix (a model directory's config.json)."""
        key = self.location.key.rstrip("/") + "/" + name
        location = dataclasses.replace(self.location, key=key)
        return dataclasses.replace(self, location=location, uri=self.uri.rstrip("/") + "/" + name)

    def worker_env(self, platform_env: Mapping[str, str]) -> dict[str, str]:
        """The storage part of a worker's environment: these credentials and nothing else."""
        env: dict[str, str] = {"AWS_DEFAULT_REGION": self.region}
        if self.location.kind in ("store", "s3"):
            endpoint = self.worker_endpoint_url or self.endpoint_url
            if endpoint:
                env["AWS_ENDPOINT_URL"] = endpoint
            if self.key_pair is not None:
                env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = self.key_pair
            else:
                for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
                    if platform_env.get(name):
                        env[name] = platform_env[name]
        if self.location.kind == "hf" and self.hub_token:
            for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
                if platform_env.get(name):
                    env[name] = platform_env[name]
        return env


def _invalid(field: str, uri: str, reason: str) -> InvalidRequest:
    return InvalidRequest(
        f"{field} {uri!r}: {reason}", errors=[{"field": field, "message": reason}]
    )


def parse(uri: str, field: str) -> uris.Location:
    try:
        return uris.parse(uri)
    except uris.UriError as exc:
        raise _invalid(field, exc.uri, exc.reason) from None


def resolve(
    session: Session, settings: Settings, tenant_id: str, uri: str, field: str = "model"
) -> Access:
    """How `tenant_id` reads `uri`; InvalidRequest (422, naming `field`) when it may not."""
    access = _resolve(session, settings, tenant_id, uri, field)
    if (
        settings.worker_s3_endpoint_url
        and access.location.kind in ("store", "s3")
        and access.endpoint_url == settings.s3_endpoint_url
    ):
        # the platform's own endpoint, whoever's credentials: workers take their own path to it
        return dataclasses.replace(access, worker_endpoint_url=settings.worker_s3_endpoint_url)
    return access


def _resolve(session: Session, settings: Settings, tenant_id: str, uri: str, field: str) -> Access:
    loc = parse(uri, field)
    platform = (settings.s3_endpoint_url, settings.s3_region)
    if loc.kind == "store":
        physical = f"s3://{settings.store_bucket}/{uris.store_key(tenant_id, loc.key)}"
        return Access(loc, physical, *platform, key_pair=None, hub_token=False)
    if loc.kind == "s3":
        if loc.bucket == settings.results_bucket and loc.key.startswith(f"batches/{tenant_id}/"):
            return Access(loc, loc.uri, *platform, key_pair=None, hub_token=False)
        cred = _credential(session, tenant_id, loc.bucket)
        if cred is None:
            raise _invalid(
                field,
                uri,
                f"no storage credentials registered for bucket '{loc.bucket}': upload into "
                "your namespace (store://path: `platform models upload`) or register "
                "credentials for the bucket (POST /v1/storage-credentials)",
            )
        secret = secrets_box.open_(settings, cred.secret_ciphertext)
        endpoint = cred.endpoint_url or settings.s3_endpoint_url
        return Access(loc, loc.uri, endpoint, cred.region, (cred.access_key_id, secret), False)
    if loc.kind == "host":
        if not (settings.allow_host_paths and _is_operator(session, tenant_id)):
            raise _invalid(
                field,
                uri,
                "host paths are not available: upload the files into your namespace "
                "(store://path) instead",
            )
        return Access(loc, loc.uri, None, settings.s3_region, key_pair=None, hub_token=False)
    hub_token = _is_operator(session, tenant_id)
    return Access(loc, loc.uri, None, settings.s3_region, key_pair=None, hub_token=hub_token)


def _is_operator(session: Session, tenant_id: str) -> bool:
    tenant = session.get(Tenant, tenant_id)
    return bool(tenant and tenant.is_operator)


def platform_access(settings: Settings) -> Access:
    """The platform's own credentials on its own buckets (never for a tenant-named key)."""
    location = uris.Location("s3", settings.store_bucket, "")
    return Access(location, "", settings.s3_endpoint_url, settings.s3_region, None, False)


def platform_env() -> dict[str, str]:
    """The platform's own storage credentials, as this process received them."""
    return {k: v for k, v in os.environ.items() if k in CREDENTIAL_ENV}


# --- S3 access with the right credentials ---------------------------------------------------


def s3_client(access: Access, timeout_s: float | None = None) -> S3Client:
    """A client with `access`'s credentials. `timeout_s`: connect and read timeouts, and no
    retries (a probe); by default, patient ones for transfers.

    Clients are kept (boto3's are safe to share between threads): building one costs ~60 ms
    of CPU and leaves ~35k objects in reference cycles, which the API process's next full
    collection walked with its event loop stopped; a deployment's check alone took several.
    One is kept per credentials, endpoint, region and timeouts, and per the process's own
    credential variables as they are now, so a changed environment gets a new one.
    """
    endpoint = access.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    env = tuple(os.environ.get(name) for name in CREDENTIAL_ENV)
    return _client(access.key_pair, endpoint, access.region, timeout_s, env)


# Enough for the platform's own clients and the tenants' registered buckets in use at once;
# the least recently used goes first.
CLIENTS_KEPT = 64


@functools.lru_cache(maxsize=CLIENTS_KEPT)
def _client(
    key_pair: tuple[str, str] | None,
    endpoint_url: str | None,
    region: str,
    timeout_s: float | None,
    env: tuple[str | None, ...],  # (only its part of the key: boto3 reads the environment)
) -> S3Client:
    import boto3
    from botocore.config import Config

    kwargs: dict[str, Any] = {}
    if key_pair is not None:
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = key_pair
    # A session of its own: the platform's credentials come from the environment as it is now.
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        config=Config(
            s3={"addressing_style": "path"},
            # Plain S3-compatible servers reject the newer default checksum headers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 5 if timeout_s is None else 1, "mode": "standard"},
            connect_timeout=10 if timeout_s is None else timeout_s,
            read_timeout=60 if timeout_s is None else timeout_s,
        ),
        **kwargs,
    )


def bucket_key(access: Access) -> tuple[str, str]:
    bucket, _, key = access.uri.removeprefix("s3://").partition("/")
    return bucket, key


# --- registered credentials -----------------------------------------------------------------


def _credential(session: Session, tenant_id: str, bucket: str) -> StorageCredential | None:
    return session.scalars(
        select(StorageCredential).where(
            StorageCredential.tenant_id == tenant_id, StorageCredential.bucket == bucket
        )
    ).first()


def allowed_endpoints(settings: Settings) -> set[str | None]:
    """Endpoints a tenant may name: the platform's own, and those the operator listed."""
    own = settings.s3_endpoint_url
    return {None, own, *(e.rstrip("/") for e in settings.storage_endpoints)}


def register(
    session: Session,
    settings: Settings,
    tenant_id: str,
    body: Mapping[str, Any],
    now: datetime,
) -> StorageCredential:
    """Store a key pair for one bucket of the tenant (the secret encrypted)."""
    bucket = str(body["bucket"])
    parse(f"s3://{bucket}/x", "bucket")  # the bucket name's own rules
    region = str(body.get("region") or settings.s3_region)
    # boto3 builds AWS hostnames from the region: anything but a region name could redirect it
    if not _REGION.fullmatch(region):
        raise _invalid("region", region, "is not a region name (e.g. eu-west-1)")
    if bucket in (settings.store_bucket, settings.results_bucket, *settings.reserved_buckets):
        raise _invalid("bucket", bucket, "is the platform's own bucket")
    endpoint = body.get("endpoint_url")
    endpoint = endpoint.rstrip("/") if endpoint else None
    if endpoint not in allowed_endpoints(settings):
        raise _invalid(
            "endpoint_url",
            str(endpoint),
            "is not an endpoint this platform reads from (the operator lists them in "
            "PLATFORM_STORAGE_ENDPOINTS)",
        )
    if _credential(session, tenant_id, bucket) is not None:
        raise Conflict(
            f"credentials for bucket '{bucket}' are registered already; delete them first",
            bucket=bucket,
        )
    row = StorageCredential(
        id=new_id("scr", now),
        tenant_id=tenant_id,
        bucket=bucket,
        endpoint_url=endpoint,
        region=region,
        access_key_id=str(body["access_key_id"]),
        secret_ciphertext=secrets_box.seal(settings, str(body["secret_access_key"])),
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row


def list_credentials(session: Session, tenant_id: str) -> list[StorageCredential]:
    return list(
        session.scalars(
            select(StorageCredential)
            .where(StorageCredential.tenant_id == tenant_id)
            .order_by(StorageCredential.bucket)
        )
    )


def delete_credential(session: Session, tenant_id: str, cred_id: str) -> None:
    row = session.get(StorageCredential, cred_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"storage credential '{cred_id}' does not exist")
    session.delete(row)


def credential_public(row: StorageCredential) -> dict[str, Any]:
    """Never the secret; the key id only by its last four characters."""
    return {
        "id": row.id,
        "bucket": row.bucket,
        "endpoint_url": row.endpoint_url,
        "region": row.region,
        "access_key_id": "…" + row.access_key_id[-4:],
        "created_at": row.created_at.isoformat().replace("+00:00", "Z"),
    }


__all__ = [
    "CREDENTIAL_ENV",
    "Access",
    "bucket_key",
    "credential_public",
    "delete_credential",
    "list_credentials",
    "platform_env",
    "register",
    "resolve",
    "s3_client",
]
