#!/usr/bin/env bash
# The busy-box tier, run by hand: two processes burn a core each beside the test suite, as on
# a shared CI runner (load 4 on 2 cores), and the wall time is printed. Tests that assert a
# verdict must hold there (docs/development.md: "A busy box").
#   scripts/busy_ci.sh                       CI's suite (.ci/run's pytest command) in this venv
#   scripts/busy_ci.sh --ci                  all of .ci/run (a fresh venv) beside the burners
#   scripts/busy_ci.sh -- ARGS...            pytest ARGS... (e.g. one test file)
#   BURNERS=3 scripts/busy_ci.sh ...         a different number of burning processes
set -euo pipefail
cd "$(dirname "$0")/.."
burners=()
stop() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${burners[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq "${BURNERS:-2}"); do
  python3 -c 'while True: pass' &
  burners+=("$!")
done
echo "busy box: ${#burners[@]} burning processes (pids ${burners[*]}), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
start=$(date +%s)
status=0
if [ "${1:-}" = "--ci" ]; then
  .ci/run || status=$?
else
  [ "${1:-}" = "--" ] && shift
  if [ "$#" -eq 0 ]; then set -- -m 'not slow'; fi
  python -m pytest "$@" || status=$?
fi
end=$(date +%s)
echo "busy box: exit ${status} after $((end - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg) at the end" >&2
exit "$status"
