#!/usr/bin/env bash
# Static checks of the test command: generated-code freshness, import contracts
# between the layers, the tree's shape limits (scripts/structure.py), lint,
# format, types.
# (The README's test command runs this, then the default pytest suite.)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# The project's own venv whenever it exists, even with another venv active.
if [[ -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
bash scripts/gen_proto.sh --check
lint-imports --no-cache
# No import circle, no module above 700 lines, no function above 8 parameters.
python scripts/structure.py
# Lint and type-check a copy of the tree in a folder named `svtagg`, as a clone
# made the natural way is: mypy names the modules after the folder (in a folder
# of another name it cannot follow the `svtagg.*` imports and checks far less),
# so every clone, CI's included, sees what a user's clone sees.
lint_dir="$(mktemp -d)"
trap 'rm -rf "$lint_dir"' EXIT
mkdir "$lint_dir/svtagg"
tar -C "$root" -cf - \
    --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude=./results \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.mypy_cache --exclude=.ruff_cache \
    --exclude=.pytest_cache --exclude='*.so' --exclude='*.sqlite' . |
    tar -C "$lint_dir/svtagg" -xf -
cd "$lint_dir/svtagg"
ruff check --no-cache .
ruff format --check --no-cache .
mypy --cache-dir "$root/.mypy_cache/svtagg-clone" \
    mpc vdaf dp proto/vocab.py proto/tls.py proto/wire.py client servers analyst deploy benchmarks \
    experiments
