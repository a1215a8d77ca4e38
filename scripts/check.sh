#!/usr/bin/env bash
# Static checks of the test command: generated-code freshness, lint, types.
# (The README's test command runs this, then the default pytest suite.)
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's own venv whenever it exists, even with another venv active.
if [[ -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
bash scripts/gen_proto.sh --check
ruff check .
mypy mpc analyst servers client benchmarks
