#!/usr/bin/env bash
# The project's test command: lint, types, generated-code freshness, then the fast tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
mypy mpc analyst servers client benchmarks
python -m pytest -q
