#!/usr/bin/env bash
# The heavy runs: large statistical audits and long tests (minutes, not for every CI run).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
python -m pytest -q -s -m heavy "$@"
