#!/usr/bin/env bash
# Regenerate the committed gRPC/protobuf code in proto/ from proto/*.proto.
#   scripts/gen_proto.sh          regenerate in place
#   scripts/gen_proto.sh --check  fail if the committed code differs from a fresh run
# The .proto files are compiled from a temporary tree laid out as svtagg/proto/
# so that the generated modules import each other as `svtagg.proto.x_pb2`.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# The project's own venv when it exists, whatever venv the caller has active.
py=python
[[ -x .venv/bin/python ]] && py="$root/.venv/bin/python"
check=0
[[ "${1:-}" == "--check" ]] && check=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/svtagg/proto" "$tmp/out"
cp proto/*.proto "$tmp/src/svtagg/proto/"
(cd "$tmp/src" && "$py" -m grpc_tools.protoc -I. \
    --python_out="$tmp/out" --pyi_out="$tmp/out" --grpc_python_out="$tmp/out" \
    svtagg/proto/*.proto)
status=0
for f in "$tmp"/out/svtagg/proto/*; do
    name="$(basename "$f")"
    if (( check )); then
        if ! cmp -s "$f" "proto/$name"; then
            echo "proto/$name is stale: run scripts/gen_proto.sh" >&2
            status=1
        fi
    else
        cp "$f" "proto/$name"
    fi
done
if (( check )); then
    for f in proto/*_pb2.py proto/*_pb2_grpc.py proto/*_pb2.pyi; do
        [[ -e "$f" ]] || continue
        [[ -e "$tmp/out/svtagg/proto/$(basename "$f")" ]] || { echo "$f has no .proto" >&2; status=1; }
    done
fi
exit $status
