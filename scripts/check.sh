#!/usr/bin/env bash
# The project's test command: generated-code freshness, lint, types, then the
# default (fast) test suite.  Heavy statistical and load runs: scripts/heavy.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
bash scripts/gen_proto.sh --check
ruff check .
mypy mpc analyst servers client benchmarks
python -m pytest -q
