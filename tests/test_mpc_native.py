"""The native core against the numpy reference: the same bytes for every
operation (hash, AND layers, fused carry chains, IKNP transpose), parties of
different engines talking to each other at the width boundaries, the forced
numpy fallback, and that the core is actually built where it can be."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import cross_engine_pair

from svtagg.mpc import native
from svtagg.mpc.aes import TweakableHash, make_tweaks
from svtagg.mpc.circuits import bit_planes, plain_first_yes, planes, sign_yes
from svtagg.mpc.garble import EvalBackend, GarbleBackend
from svtagg.mpc.ot import transpose_rows

RNG = np.random.default_rng(20261201)


def _cpu_has_aes() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return False
    return " aes " in f" {flags.split(':', 1)[-1].strip()} "


def test_native_core_is_built_on_x86_64_with_aes() -> None:
    """The install must build the core where it can: a silent fallback on this
    kind of machine would hide a broken build."""
    if platform.machine() not in ("x86_64", "AMD64") or not _cpu_has_aes():
        pytest.skip("no AES-NI here: the numpy backend is the expected one")
    assert native.available(), native.describe()
    assert native.active() == "native" or os.environ.get("SVTAGG_BACKEND") == "numpy"


needs_native = pytest.mark.skipif(not native.available(), reason="native core not built")


@pytest.fixture
def vaes_modes() -> Iterator[list[bool]]:
    """Both AES paths where the CPU has VAES; the default state is restored."""
    modes = [False, True] if native.available() and native.core().features()["vaes"] else [False]
    yield modes
    native.set_vaes(True)


@needs_native
@pytest.mark.parametrize("n", [1, 3, 4, 7, 15, 16, 17, 33, 100, 1031])
def test_hash_matches_numpy(n: int, vaes_modes: list[bool]) -> None:
    x = RNG.integers(0, 2**64, (n, 2), dtype=np.uint64)
    tw = make_tweaks(12345, 7, n)
    ref = TweakableHash()(x, tw).copy()
    for on in vaes_modes:
        native.set_vaes(on)
        assert np.array_equal(native.NativeHash()(x, tw), ref)


def _labels(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.integers(0, 2**64, shape + (2,), dtype=np.uint64)


def _delta() -> np.ndarray:
    d = RNG.integers(0, 2**64, 2, dtype=np.uint64)
    d[0] |= np.uint64(1)
    return d


@needs_native
@pytest.mark.parametrize("n", [1, 5, 16, 31, 300])
def test_and_layers_match_numpy_bytes(n: int) -> None:
    d = _delta()
    a0, b0 = _labels((n,)), _labels((n,))
    bits = RNG.integers(0, 2, n).astype(np.uint8)
    h = TweakableHash()
    ref, nat = GarbleBackend(d, h, 99), native.NativeGarbleBackend(d, native.NativeHash(), 99)
    for be in (ref, nat):
        be.and_layers = 3  # a later layer, to exercise the layer part of the tweak
    outs_ref = [ref.and_(a0, b0), ref.and_const(bits, b0)]
    outs_nat = [nat.and_(a0, b0), nat.and_const(bits, b0)]
    assert ref.table_bytes() == nat.table_bytes()
    for x, y in zip(outs_ref, outs_nat, strict=True):
        assert np.array_equal(x, y)
    # Evaluation on active labels, both engines: the same output labels.
    av, bv = RNG.integers(0, 2, n), RNG.integers(0, 2, n)
    a = a0 ^ ((-(av.astype(np.uint64)))[:, None] & d)
    b = b0 ^ ((-(bv.astype(np.uint64)))[:, None] & d)
    tables = ref.table_bytes()
    er, en = EvalBackend(h, 99, tables), native.NativeEvalBackend(native.NativeHash(), 99, tables)
    for be in (er, en):
        be.and_layers = 3
    got = [(be.and_(a, b), be.and_const(None, b)) for be in (er, en)]
    for x, y in zip(got[0], got[1], strict=True):
        assert np.array_equal(x, y)
    # And they decode to the plaintext: c = c0 ⊕ (a∧b)·Δ.
    expect = (av & bv).astype(np.uint64)
    assert np.array_equal(got[1][0], outs_ref[0] ^ ((-expect)[:, None] & d))


@needs_native
@pytest.mark.parametrize("width", [8, 16, 40, 64])
@pytest.mark.parametrize("n", [1, 17, 4096 + 33])
def test_fused_carry_chain_matches_gate_by_gate(width: int, n: int) -> None:
    """The fused chain sends exactly the gate-by-gate tables (several lane
    batches when n > 4096) and decodes to the plaintext YES."""
    lim = 2 ** (width - 1)
    sums = RNG.integers(-lim, lim, n)
    sums[: min(n, 4)] = [lim - 1, -lim, 0, -1][: min(n, 4)]
    z = sums.astype(np.int64).view(np.uint64)
    z_l = RNG.integers(0, 2**64, n, dtype=np.uint64)
    z_h = z - z_l
    d = _delta()
    b0 = _labels((width, n))
    a_bits = bit_planes(z_l)
    ref = GarbleBackend(d, TweakableHash(), 5)
    nat = native.NativeGarbleBackend(d, native.NativeHash(), 5)
    yes_ref = sign_yes(ref, a_bits, planes(b0), n, width)
    yes_nat = sign_yes(nat, a_bits, planes(b0), n, width)
    assert ref.table_bytes() == nat.table_bytes()
    assert np.array_equal(yes_ref, yes_nat) and ref.and_layers == nat.and_layers
    hb = bit_planes(z_h)[:width].astype(np.uint64)
    b_act = b0 ^ ((-hb)[..., None] & d)
    ev = native.NativeEvalBackend(native.NativeHash(), 5, nat.table_bytes())
    yes = sign_yes(ev, None, planes(b_act), n, width)
    ev.done()
    got = (yes[:, 0] & np.uint64(1)).astype(np.uint8) ^ nat.decoding(yes_nat)
    low = (z_l + z_h) & np.uint64((1 << width) - 1)
    expect = (low < np.uint64(lim)).astype(np.uint8)  # sign bit of the w-bit sum clear
    assert np.array_equal(got, expect)
    assert np.array_equal(expect, (sums >= 0).astype(np.uint8))


def _numpy_transpose(mat: np.ndarray) -> np.ndarray:
    with_numpy = native.active()
    native.use("numpy")
    try:
        return transpose_rows(mat)
    finally:
        native.use(with_numpy)


@needs_native
@pytest.mark.parametrize("nb", [1, 2, 15, 16, 17, 63, 64, 100, 131, 4097])
def test_transpose_matches_numpy(nb: int, vaes_modes: list[bool]) -> None:
    """Every path of the native transpose: 64-column tiles (AVX-512, with the
    VAES path on), 16-column tiles, the column-by-column tail."""
    base = RNG.integers(0, 256, (128, nb + 13), dtype=np.uint8)
    mat = base[:, 5 : 5 + nb]  # strided rows, as the OT extension passes them
    ref = _numpy_transpose(mat)
    for on in vaes_modes:
        native.set_vaes(on)
        out = np.empty((8 * nb, 2), dtype=np.uint64)
        assert np.array_equal(native.transpose_rows_native(mat, out), ref)
    # And the reference itself: bit i of block j = bit j of row i.
    bits = np.unpackbits(mat, axis=1, bitorder="little")
    j = RNG.integers(0, 8 * nb, 20)
    blk = np.unpackbits(ref.view(np.uint8).reshape(-1, 16), axis=1, bitorder="little")
    assert np.array_equal(blk[j], bits[:, j].T)


@needs_native
@pytest.mark.parametrize("engines", [("native", "numpy"), ("numpy", "native")])
@pytest.mark.parametrize("width", [16, 33, 40, 64])
async def test_engines_interoperate_at_the_width_boundaries(
    engines: tuple[str, str], width: int
) -> None:
    """A native garbler with a numpy evaluator and the reverse: the wire format
    is one, so every boundary ±(2^(w−1) − 1), 0, −1 is decided correctly."""
    g, e = await cross_engine_pair(*engines)
    assert (g.engine, e.engine) == engines
    lim = 2 ** (width - 1)
    for s in [lim - 1, -(lim - 1), 0, -1, 1, -lim]:
        sums = np.array([-5, -7, s, 3], dtype=np.int64)
        z_l = RNG.integers(0, 2**64, 4, dtype=np.uint64)
        z_h = sums.view(np.uint64) - z_l
        got = await asyncio.gather(g.first_yes(z_l, width), e.first_yes(z_h, width))
        want = 2 if s >= 0 else 3
        assert got == [want, want] and plain_first_yes(z_l, z_h) == want


def test_forced_numpy_fallback_runs_the_protocol() -> None:
    """SVTAGG_BACKEND=numpy: the numpy engine is active and a chunk still works."""
    code = (
        "import asyncio, numpy as np\n"
        "from svtagg.mpc import native\n"
        "from svtagg.mpc.protocol import run_first_yes\n"
        "assert native.active() == 'numpy', native.describe()\n"
        "z = np.array([-3, 4], dtype=np.int64).view(np.uint64)\n"
        "zl = np.array([12345, 999], dtype=np.uint64)\n"
        "print(native.describe(), asyncio.run(run_first_yes(zl, z - zl)))\n"
    )
    env = dict(os.environ, SVTAGG_BACKEND="numpy")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("numpy") and out.stdout.strip().endswith(" 1")


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        native.use("fortran")


@needs_native
def test_iknp_row_prg_matches_openssl() -> None:
    """The native AES-CTR rows equal OpenSSL's, piece after piece."""
    from svtagg.mpc.ot import KAPPA, _RowPRG

    keys = [os.urandom(16) for _ in range(KAPPA)]
    widths = [5, 16, 17, 300, 1, 64]
    before = native.active()
    outs: dict[str, list[np.ndarray]] = {}
    try:
        for name in ("numpy", "native"):
            native.use(name)
            stream = _RowPRG(keys).stream(nonce=2**40 + 7, max_width=max(widths))
            outs[name] = [stream.read(w).copy() for w in widths]
    finally:
        native.use(before)
    for a, b in zip(outs["numpy"], outs["native"], strict=True):
        assert np.array_equal(a, b)


@needs_native
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_thread_count_does_not_change_a_byte(threads: int) -> None:
    """Carry chains and wide transposes split over threads: the same bytes as
    one thread, with pieces that do not align to the thread split.  (The PRG
    rows run on one thread whatever the setting; they are checked alongside.)"""
    from svtagg.mpc.ot import KAPPA, _RowPRG

    n, width = 4096 + 33, 40
    d = _delta()
    a_bits = bit_planes(RNG.integers(0, 2**64, n, dtype=np.uint64))
    b0 = _labels((width, n))
    wide = 2**17 + 5  # transposes split over threads only from 2^17 columns
    mat = RNG.integers(0, 256, (128, wide + 3), dtype=np.uint8)[:, 3:]
    keys = [os.urandom(16) for _ in range(KAPPA)]
    before = native.threads()
    outs = []
    try:
        for t in (1, threads):
            native.set_threads(t)
            g = native.NativeGarbleBackend(d, native.NativeHash(), 11)
            yes = sign_yes(g, a_bits, planes(b0), n, width)
            e = native.NativeEvalBackend(native.NativeHash(), 11, g.table_bytes())
            act = sign_yes(e, None, planes(b0), n, width)  # all-zero evaluator bits
            tr = native.transpose_rows_native(mat, np.empty((8 * wide, 2), np.uint64))
            rows = _RowPRG(keys).stream(nonce=5, max_width=3000).read(3000).copy()
            outs.append((g.table_bytes(), yes, act, tr, rows))
    finally:
        native.set_threads(before)
    for x, y in zip(outs[0], outs[1], strict=True):
        if isinstance(x, bytes):
            assert x == y
        else:
            assert np.array_equal(x, y)


def test_version_and_doctor_name_the_engine() -> None:
    """`svtagg --version` names the engine in use; `svtagg doctor --json` checks
    every available engine against the plaintext answer."""
    import json
    import shutil

    exe = shutil.which("svtagg") or os.path.join(os.path.dirname(sys.executable), "svtagg")
    for backend, expect in (
        ("auto", "native" if native.available() else "numpy"),
        ("numpy", "numpy"),
    ):
        env = dict(os.environ, SVTAGG_BACKEND=backend)
        out = subprocess.run(
            [exe, "--version"], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert f"comparison engine: {expect}" in out.stdout
    out = subprocess.run(
        [exe, "doctor", "--json", "--k", "300"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and [c["engine"] for c in report["checks"]] == (
        ["numpy", "native"] if native.available() else ["numpy"]
    )
    assert all(c["ok"] for c in report["checks"])


@pytest.mark.heavy
def test_install_without_a_compiler_falls_back_to_numpy(tmp_path: Path) -> None:
    """The extension is optional: with a C compiler that always fails the
    install still succeeds, without the core, and the numpy engine runs."""
    root = Path(__file__).resolve().parents[1]
    target = tmp_path / "site"
    env = dict(os.environ, CC="/bin/false")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(root),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert not list((target / "svtagg" / "mpc").glob("_gc*.so"))
    code = (
        "import asyncio, numpy as np\n"
        "from svtagg.mpc import native\n"
        "from svtagg.mpc.protocol import run_first_yes\n"
        "assert not native.available() and native.active() == 'numpy'\n"
        "z = np.array([-3, 4], dtype=np.int64).view(np.uint64)\n"
        "zl = np.array([7, 9], dtype=np.uint64)\n"
        "print(native.describe(), asyncio.run(run_first_yes(zl, z - zl)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(target)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("numpy (native core unavailable") and run.stdout.strip().endswith(
        " 1"
    )


# ---------------------------------------------------------------- hostile shapes
def _run_isolated(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter: a crash of the core fails this test
    instead of the whole run, and no scratch buffer of earlier tests exists."""
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout
    )


# Every block operation on inputs and outputs at each misalignment, against
# the same call on aligned copies (an 8-byte offset is what a numpy view of a
# received bytes object can have).
_MISALIGNED = r"""
import numpy as np
from svtagg.mpc import native

g = native.core()
rng = np.random.default_rng(7)


def at(offset, shape, dtype=np.uint64, fill=None):
    '''A C-contiguous array starting `offset` bytes past a 64-byte boundary.'''
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start : start + n].view(dtype).reshape(shape)
    out[...] = fill if fill is not None else rng.integers(0, 2**63, shape).astype(dtype)
    return out


n, w = 37, 8
d = rng.integers(0, 2**63, 2).astype(np.uint64)
d[0] |= np.uint64(1)
cases = {
    "tccr": lambda o: g.tccr(at(o, (n, 2)), at(o, (n, 2)), at(o, (n, 2), fill=0)),
    "garble_and": lambda o: g.garble_and(
        at(o, (n, 2)), at(o, (n, 2)), d, 3, 1, at(o, (n, 2), fill=0), at(o, (2 * n, 2), fill=0)
    ),
    "eval_and": lambda o: g.eval_and(
        at(o, (n, 2)), at(o, (n, 2)), at(o, (2 * n, 2)), 3, 1, at(o, (n, 2), fill=0)
    ),
    "garble_and_const": lambda o: g.garble_and_const(
        at(o, (n,), np.uint8, fill=1), at(o, (n, 2)), d, 3, 1,
        at(o, (n, 2), fill=0), at(o, (n, 2), fill=0),
    ),
    "eval_and_const": lambda o: g.eval_and_const(
        at(o, (n, 2)), at(o, (n, 2)), 3, 1, at(o, (n, 2), fill=0)
    ),
    "garble_sign": lambda o: g.garble_sign(
        at(o, (w, n), np.uint8, fill=1), at(o, (w, n, 2)), d, 3, 1, w,
        at(o, (n, 2), fill=0), at(o, ((2 * w - 3) * n, 2), fill=0),
    ),
    "eval_sign": lambda o: g.eval_sign(
        at(o, (w, n, 2)), at(o, ((2 * w - 3) * n, 2)), 3, 1, w, at(o, (n, 2), fill=0)
    ),
    "transpose128": lambda o: g.transpose128(
        at(o, (128, 4), np.uint8), at(o, (32, 2), fill=0)
    ),
}


def outputs(name, offset):
    '''The call's output arrays (filled by it), from a fixed seed.'''
    global rng
    rng = np.random.default_rng(11)
    made = []
    real_at = globals()["at"]

    def tracking(o, shape, dtype=np.uint64, fill=None):
        arr = real_at(o, shape, dtype, fill)
        made.append(arr)
        return arr

    globals()["at"] = tracking
    try:
        cases[name](offset)
    finally:
        globals()["at"] = real_at
    return [a.copy() for a in made]


for name in cases:
    ref = outputs(name, 0)
    for offset in (1, 4, 8, 12):
        got = outputs(name, offset)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), (name, offset)
print("ok", len(cases))
"""


@needs_native
def test_misaligned_buffers_give_the_aligned_bytes() -> None:
    """No operation assumes 16-byte alignment: every misaligned case computes
    the same bytes as the aligned one (no crash)."""
    done = _run_isolated(_MISALIGNED)
    assert done.returncode == 0 and done.stdout.startswith("ok 8"), (
        done.returncode,
        done.stderr[-2000:],
    )


@needs_native
def test_prg_rows_refuses_a_shape_whose_size_overflows() -> None:
    """2^23 + 1 schedules (an untouched anonymous mapping, no memory used) at a
    2^40-byte stride: the size check must not wrap and let the core write far
    past a 16-byte output."""
    script = r"""
import mmap
from svtagg.mpc import native
schedules = mmap.mmap(-1, 176 * ((1 << 23) + 1))
out = bytearray(16)
try:
    native.core().prg_rows(schedules, 1, 0, 1, out, 1 << 40)
except ValueError as exc:
    print("refused:", exc)
else:
    print("accepted")
"""
    done = _run_isolated(script)
    assert done.returncode == 0 and done.stdout.startswith("refused"), (
        done.returncode,
        done.stdout,
        done.stderr[-2000:],
    )


@needs_native
def test_hash_of_no_blocks_is_empty() -> None:
    """Zero blocks hash to zero blocks (in a fresh process: no scratch yet)."""
    script = r"""
import numpy as np
from svtagg.mpc import native
empty = np.empty((0, 2), dtype=np.uint64)
native.core().tccr(empty, empty, np.empty((0, 2), dtype=np.uint64))
assert native.NativeHash()(empty, empty).shape == (0, 2)
print("ok")
"""
    done = _run_isolated(script)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


@pytest.mark.heavy
def test_native_core_is_clean_under_sanitizers() -> None:
    """scripts/sanitize.sh: the core built with ASan+UBSan runs the native tests
    (these included: byte equality, misalignment, overflowing shapes) with no
    report; a report aborts the process it happens in and fails this."""
    import shutil

    if shutil.which("gcc") is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the sanitizer build needs gcc on x86-64")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["bash", str(root / "scripts" / "sanitize.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tail = (done.stdout[-3000:] + done.stderr[-3000:]).strip()
    print(tail.splitlines()[-1] if tail else "")
    assert done.returncode == 0, tail
    assert "built with ASan+UBSan" in done.stdout and " passed" in done.stdout, tail
