#!/usr/bin/env bash
# Static checks of the test command: generated-code freshness, import contracts
# between the layers, lint, format, types.
# (The README's test command runs this, then the default pytest suite.)
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's own venv whenever it exists, even with another venv active.
if [[ -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
bash scripts/gen_proto.sh --check
lint-imports --no-cache
ruff check .
ruff format --check .
mypy mpc dp proto/vocab.py proto/tls.py proto/wire.py client servers analyst deploy benchmarks
