#!/bin/bash
# The long form of the fault suite as docs/reliability.md reports it: every scenario once, each
# at its own size (`make faults` runs them all at one size instead), on a fresh platform each.
# Usage: tests/faults/long_form.sh [LOG]     (about 17 minutes on 2 cores)
set -u
cd "$(dirname "$0")/../.."
log=${1:-/dev/stdout}
run() {  # name, VAR=value..., module
  local name=$1; shift
  local module=${*: -1}
  local envs=("${@:1:$#-1}")
  echo "=== $name: ${envs[*]}" >>"$log"
  local t0; t0=$(date +%s)
  env "${envs[@]}" .venv/bin/pytest "tests/faults/$module" -m faults -q -p no:cacheprovider \
    --basetemp="/tmp/faults-long-form-$name" 2>&1 | grep -v '^INFO\|^WARNING' | tail -25 >>"$log"
  echo "=== $name took $(( $(date +%s) - t0 )) s" >>"$log"
}
run worker_kills FAULTS_JOBS=2000 FAULTS_WORKER_KILLS=50 test_worker_kills.py
run redis_restarts FAULTS_JOBS=300 FAULTS_REDIS_RESTARTS=6 test_redis_restarts.py
run control_plane FAULTS_JOBS=300 FAULTS_CONTROL_PLANE_KILLS=6 test_control_plane_kills.py
run failover FAULTS_JOBS=150 FAULTS_FAILOVERS=4 test_reconciler_failover.py
run cold_start FAULTS_JOBS=100 FAULTS_COLD_START_KILLS=20 test_cold_start_kills.py
run network FAULTS_JOBS=150 FAULTS_NETWORK_FAULTS=20 test_network_faults.py
run duplicates FAULTS_JOBS=300 FAULTS_DUPLICATIONS=50 test_duplicate_deliveries.py
run webhooks FAULTS_JOBS=200 test_webhook_receiver_faults.py
run sdk_restart FAULTS_JOBS=12 test_sdk_api_restart.py
run callers FAULTS_JOBS=100 FAULTS_CALLER_FAULTS=16 test_callers_across_faults.py
