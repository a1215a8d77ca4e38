#!/usr/bin/env bash
# The heavy statistical runs (not for every CI run): the large privacy audit,
# sampler/selection/engine checks at full size, remote-vs-local agreement for
# every kind, and the native core under ASan+UBSan (scripts/sanitize.sh, from
# tests/test_mpc_native.py).  The reliability suites (crash, external kills,
# hostile input, load, remote audit) have their own command: scripts/reliability.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then  # the project's venv, whatever is active
    . .venv/bin/activate
fi
python -m pytest -q -s -m heavy \
    --ignore=tests/test_reliability.py --ignore=tests/test_kill_loop.py \
    --ignore=tests/test_hostile.py \
    --ignore=tests/test_load.py --ignore=tests/test_remote_audit.py "$@"
