#!/usr/bin/env bash
# Smoke test of the nothing-but-Python path: with neither DATABASE_URL nor REDIS_URL set,
# devtools.embedded must start real PostgreSQL and Redis in a fresh data folder, a job must go
# through enqueue -> worker -> succeeded across separate launcher runs (data persists), and
# nothing may be left running afterwards.
#
#   bash tests/smoke_embedded.sh          (uses .venv; SMOKE_PYTHON=/path/to/python overrides)
#
# Prints PASS/FAIL lines; exits non-zero on the first failure. Budget: well under 2 minutes.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${SMOKE_PYTHON:-$ROOT/.venv/bin/python}
STEP_TIMEOUT=${SMOKE_STEP_TIMEOUT:-60}
STARTED=$(date +%s)

unset DATABASE_URL REDIS_URL DATABASE_URL_FILE REDIS_URL_FILE
unset PGHOST PGPORT PGUSER PGDATABASE
export DJANGO_SETTINGS_MODULE=koala.settings
# DEBUG stays off (production-like settings), so the E001 check wants a real secret.
if [ -z "${SECRET_KEY:-}" ] && [ -z "${SECRET_KEY_FILE:-}" ]; then
    SECRET_KEY=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(50))')
    export SECRET_KEY
fi
KOALA_DATA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/koala-smoke.XXXXXX")
export KOALA_DATA_DIR
OUT="$KOALA_DATA_DIR/smoke-output"
mkdir -p "$OUT"

failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=1; }

service_pids() {
    # postgres and redis processes whose command line names this data folder
    ps -eo pid=,args= | grep -F -- "$KOALA_DATA_DIR" | grep -E 'postgres|redis' | grep -v -e grep -e smoke_embedded | awk '{print $1}'
}

finish() {
    local leftovers
    leftovers=$(service_pids)
    if [ -n "$leftovers" ]; then
        fail "processes still running from $KOALA_DATA_DIR: $(echo $leftovers)"
        # They are this test's own services: stop them so CI is not left with strays.
        kill $leftovers 2>/dev/null; sleep 2; kill -9 $leftovers 2>/dev/null
    fi
    local elapsed=$(( $(date +%s) - STARTED ))
    if [ "$failed" -eq 0 ]; then
        echo "SMOKE PASS (${elapsed}s)"
        rm -rf "$KOALA_DATA_DIR"
        exit 0
    fi
    echo "SMOKE FAIL (${elapsed}s); data and logs kept in $KOALA_DATA_DIR"
    exit 1
}
trap finish EXIT

# launched NAME CMD...: run CMD under devtools.embedded, stdout to $OUT/NAME.out (also shown).
launched() {
    local name=$1; shift
    timeout -s TERM -k 15 "$STEP_TIMEOUT" "$PY" -m devtools.embedded -- "$@" </dev/null >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    sed "s/^/  [$name] /" "$OUT/$name.out" "$OUT/$name.err" | tail -n 40
    return $rc
}

if [ ! -x "$PY" ]; then
    fail "$PY not found (run scripts/bootstrap first)"
    exit 1
fi
echo "smoke: data folder $KOALA_DATA_DIR, python $PY"

# 1. migrate: first start runs initdb and creates the koala database.
if launched migrate "$PY" manage.py migrate --noinput; then
    pass "migrate through embedded PostgreSQL/Redis"
else
    fail "migrate (exit $?)"; exit 1
fi
if grep -q "started PostgreSQL" "$OUT/migrate.err" && grep -q "Redis" "$OUT/migrate.err"; then
    pass "launcher reported the embedded services"
else
    fail "launcher did not report starting PostgreSQL and Redis"
fi
leftovers=$(service_pids)
if [ -z "$leftovers" ]; then pass "services stopped after the migrate run"; else fail "services left after migrate: $leftovers"; exit 1; fi

# 2. enqueue a noop job (a second launcher run: the schema must have persisted).
if launched enqueue "$PY" manage.py koala_enqueue noop --input '{}'; then
    job_id=$(grep -E '^[0-9]+$' "$OUT/enqueue.out" | tail -n 1)
    if [ -n "$job_id" ]; then pass "enqueued noop job $job_id"; else fail "koala_enqueue printed no job id"; exit 1; fi
else
    fail "koala_enqueue (exit $?)"; exit 1
fi

# 3. burst worker, then inspect the job, in one run; record the service pids on the way.
worker_script='
set -e
head -n 1 "$KOALA_DATA_DIR/postgres/postmaster.pid" > "$KOALA_DATA_DIR/smoke-output/postgres.pid"
cat "$KOALA_DATA_DIR/redis/redis.pid" > "$KOALA_DATA_DIR/smoke-output/redis.pid"
"$0" manage.py koala_worker --burst
"$0" manage.py koala_job "$1"
'
if launched worker bash -c "$worker_script" "$PY" "$job_id"; then
    pass "koala_worker --burst and koala_job ran"
else
    fail "worker/job step (exit $?)"
fi
if grep -qw succeeded "$OUT/worker.out"; then
    pass "job $job_id succeeded"
else
    fail "job $job_id is not reported as succeeded by koala_job"
fi

# 4. everything stopped: recorded pids gone and no process names the data folder.
for svc in postgres redis; do
    pid=$(cat "$OUT/$svc.pid" 2>/dev/null || true)
    if [ -z "$pid" ]; then
        fail "no $svc pid was recorded"
    elif kill -0 "$pid" 2>/dev/null && ps -p "$pid" -o comm= | grep -qE 'postgres|redis'; then
        fail "$svc (pid $pid) still running after the launcher exited"
    else
        pass "$svc (pid $pid) stopped"
    fi
done
if [ -z "$(service_pids)" ]; then pass "no postgres/redis process left for $KOALA_DATA_DIR"; fi
# finish (EXIT trap) reports leftovers and the verdict.
