#!/usr/bin/env bash
# The native cores (mpc/_gc.c, vdaf/_field.c) under AddressSanitizer and
# UndefinedBehaviorSanitizer: builds them with gcc -fsanitize=address,undefined into
# a copy of this tree and runs the tests that drive them there (byte equality with
# the numpy / Python-integer references, hostile shapes and alignments, the
# comparison protocol and the OT extension end to end, the Prio3 test vectors),
# then scripts/fuzz_native.py: every entry point of both cores with random and
# boundary arguments (SVTAGG_FUZZ_ITERATIONS calls, 100000 by default).
# Any sanitizer report aborts the process it happens in, so it fails the run.
# The heavy run calls this (tests/test_mpc_native.py::test_native_core_is_clean_under_sanitizers).
#
#   scripts/sanitize.sh            # the native tests and the fuzzer, sanitized
#   scripts/sanitize.sh -k prg     # extra pytest arguments narrow the tests down
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -f .venv/bin/activate ]]; then  # the project's venv, whatever is active
    . .venv/bin/activate
fi
asan=$(gcc -print-file-name=libasan.so)
if [[ ! -e "$asan" ]]; then
    echo "sanitize.sh: gcc has no libasan here; install gcc's sanitizer runtime" >&2
    exit 2
fi
work=$(mktemp -d -t svtagg-sanitize.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The package is the repository root: a copy named svtagg, found first on PYTHONPATH.
mkdir "$work/svtagg"
# (no build/: an up-to-date uninstrumented object there would be linked as is)
tar --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.so' --exclude='__pycache__' \
    --exclude=./.mypy_cache --exclude=./.ruff_cache --exclude=./.pytest_cache \
    --exclude=./.hypothesis -cf - . | tar -xf - -C "$work/svtagg"
(
    cd "$work/svtagg"
    CC=gcc CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
        LDFLAGS="-fsanitize=address,undefined" python setup.py -q build_ext --inplace --force >build.log 2>&1 \
        || { cat build.log >&2; exit 1; }
)
for so in "$work"/svtagg/mpc/_gc*.so "$work"/svtagg/vdaf/_field*.so; do
    [[ -e "$so" ]] || { echo "sanitize.sh: a native core did not build (see above)" >&2; exit 1; }
    # (grep reads all of ldd's output: with -q it could stop early, and the SIGPIPE
    # ldd then gets fails the pipeline under pipefail)
    ldd "$so" | grep libasan >/dev/null || { echo "sanitize.sh: $so is not instrumented" >&2; exit 1; }
    echo "sanitize.sh: $(basename "$so") built with ASan+UBSan"
done
cd "$work/svtagg"
# Python is not built with ASan: the runtime must be loaded first (LD_PRELOAD);
# leak checks are off (the interpreter keeps its objects until exit).  The
# subprocesses the tests start inherit all of it.
sanitized=(env PYTHONPATH="$work" SVTAGG_BACKEND=native SVTAGG_VDAF_BACKEND=native PYTHONMALLOC=malloc
    LD_PRELOAD="$asan"
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1"
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
# --capture=sys: pytest captures Python's output only, so a report (written to
# file descriptor 2 by the sanitizer, which then ends the process) is not
# swallowed with the capture of the test it happened in.
"${sanitized[@]}" python -m pytest -q -p no:cacheprovider --capture=sys -m "not heavy" \
    tests/test_mpc_native.py tests/test_mpc_ot.py tests/test_mpc_protocol.py tests/test_mpc_clamp.py \
    tests/test_mpc_native_threehalves.py tests/test_mpc_threehalves.py tests/test_mpc_prefix.py \
    tests/test_vdaf_*.py tests/test_native_bounds.py "$@"
# The fuzzer names each call in its log before making it: after a crash or a
# report (in the same log), the last name is the call it happened in.
log="$work/fuzz.log"
if ! "${sanitized[@]}" python scripts/fuzz_native.py --verbose \
    --iterations "${SVTAGG_FUZZ_ITERATIONS:-100000}" 2>"$log"; then
    grep -v '^\[[0-9]*\] ' "$log" | tail -n 80 >&2 || true
    echo "sanitize.sh: the fuzzer failed in $(grep '^\[[0-9]*\] ' "$log" | tail -n 1 || true)" >&2
    exit 1
fi
