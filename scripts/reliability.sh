#!/usr/bin/env bash
# Issue 6 in one command: the heavy crash-safety, external-kill, hostile-input,
# load and remote-audit suites on real server processes, then their figures
# (kills survived per point, kills from outside per phase and the invariants
# checked, hostile inputs tried per RPC, load held, audit sample sizes, results
# and power).  ~15-20 minutes on 2 cores.  The fast parts of the
# same suites run in the default `python -m pytest -q -n 2` (the README's test command).
#
#   scripts/reliability.sh            # everything; full log in $RELIABILITY_LOG (or a temp file)
#   scripts/reliability.sh -k load    # extra pytest arguments narrow it down
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then  # the project's venv, whatever is active
    . .venv/bin/activate
fi
log="${RELIABILITY_LOG:-$(mktemp -t svtagg-reliability.XXXXXX.log)}"
python -m pytest -q -s -m heavy \
    tests/test_reliability.py tests/test_kill_loop.py tests/test_hostile.py \
    tests/test_load.py tests/test_remote_audit.py "$@" >"$log" 2>&1
rc=$?
echo "== figures (full log: $log)"
grep -E "^crash safety|^kill loop|^hostile inputs|^upload:|^streams:|^peak RSS|^remote " "$log"
tail -n 1 "$log"
exit $rc
