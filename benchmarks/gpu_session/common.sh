# Sourced by the lease scripts (lease_a.sh, lease_b.sh, next.sh): a GPU machine's run.
# OUT is where the JSON and logs go (the device tool's own folder; elsewhere a folder
# under results/). Wheels in .whl/ (mctx, pytest-asyncio) are installed when present.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-results/benchmarks/gpu_session}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
step() {  # step SECONDS NAME COMMAND...: one bounded step, its output added to $OUT/log.txt
  local limit=$1 name=$2; shift 2
  echo "== $(date +%T) $name (at most ${limit}s)" | tee -a "$OUT/log.txt"
  timeout "$limit" "$@" >"/tmp/step_$name.txt" 2>&1
  local rc=$?
  cat "/tmp/step_$name.txt" >>"$OUT/log.txt"
  echo "== $(date +%T) $name: exit $rc" | tee -a "$OUT/log.txt"
  grep -v '^[ {}\[\]"]' "/tmp/step_$name.txt" | tail -n 6
}
