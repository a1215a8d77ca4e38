"""The native cores (svtagg.vdaf._field, svtagg.mpc._gc) against arguments no
honest caller passes: sizes whose product overflows Py_ssize_t, offsets near
2^63, counts that no buffer backs, empty buffers an element would be read
from, and buffers at odd addresses.  Before the cores checked their
arguments, each call here crashed (SIGSEGV), hung, read outside a buffer
(ASan) or loaded through a misaligned pointer (UBSan; scripts/sanitize.sh runs
this file under both); now each raises ValueError, or returns having done the
nothing its empty output asks for, and misaligned buffers give the aligned
bytes.  scripts/fuzz_native.py throws random arguments of the same kinds at
every entry point."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from svtagg.mpc import native as mpc_native
from svtagg.vdaf import native as vdaf_native

needs_field = pytest.mark.skipif(not vdaf_native.available(), reason=vdaf_native.describe())
needs_gc = pytest.mark.skipif(not mpc_native.available(), reason=mpc_native.describe())

ROOT = Path(__file__).resolve().parents[1]
BIG = 1 << 62  # 4 * BIG = 2^64: a product with 4 that wraps to 0
NEAR_MAX = (1 << 63) - 4  # an offset whose sum with a small width overflows


def z64(n: int) -> np.ndarray:
    """n Field64 zeros."""
    return np.zeros(n, dtype=np.uint64)


def z128(n: int) -> np.ndarray:
    """n Field128 zeros (two words each)."""
    return np.zeros(2 * n, dtype=np.uint64)


# Each call crashed, or read past a buffer, before the checks; each must now
# raise ValueError.  (The empty buffers are where an overflowing product
# wrapped to 0 and so matched.)
REFUSED: dict[str, Callable[[Any], object]] = {
    "ntt, empty root": lambda f: f.ntt(0, z64(4), 4, z64(0), None),
    "ntt, empty scale": lambda f: f.ntt(1, z128(4), 4, z128(1), z128(0)),
    "ntt, two roots": lambda f: f.ntt(0, z64(4), 4, z64(2), None),
    "sum_rows, rows x cols wraps": lambda f: f.sum_rows(0, z64(0), BIG, z64(4)),
    "sum_last, rows x n wraps": lambda f: f.sum_last(1, z128(0), BIG, z128(4)),
    "poly_eval, rows x n wraps": lambda f: f.poly_eval(0, z64(0), BIG, z64(1), z64(4)),
    "poly_eval, empty point": lambda f: f.poly_eval(1, z128(4), 4, z128(0), z128(1)),
    "pair_products, count wraps": lambda f: f.pair_products(0, z64(0), BIG, z64(2)),
    "pair_products_last, count wraps": lambda f: f.pair_products_last(1, z128(0), BIG, z128(2)),
    "fold_rows, offset near 2^63": lambda f: f.fold_rows(0, z64(1), 1, NEAR_MAX, 8, 1, z64(1)),
    "fold_rows, rows x row_len wraps": lambda f: f.fold_rows(0, z64(0), 1 << 60, 0, 1, 1, z64(16)),
    "bits_value, groups wrap": lambda f: f.bits_value(0, z64(0), 1 << 60, 1, z64(16)),
    "mul_gadget_poly, 2 x count wraps": lambda f: f.mul_gadget_poly(
        1, z128(8), (1 << 61) + 1, z128(6), z128(6)
    ),
    "copy_rows, offset near 2^63": lambda f: f.copy_rows([bytes(16)], NEAR_MAX, 8, bytearray(8)),
    "shake_rows, rows x stride wraps": lambda f: f.shake_rows(
        ((bytes(16), 0, 8, BIG),), 4, bytearray(64)
    ),
    "simd, neither on nor off": lambda f: f.simd(2),
}


@needs_field
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_field_core_refuses_sizes_its_buffers_do_not_hold(case: str) -> None:
    with pytest.raises(ValueError):
        REFUSED[case](vdaf_native.core())


@needs_field
def test_ntt_of_no_rows_builds_no_tables_for_a_huge_n() -> None:
    """No data: nothing to transform, whatever power of two n is (the twiddle
    table of n = 2^62 elements was a wrapped 0-byte allocation, then written)."""
    assert vdaf_native.core().ntt(0, z64(0), BIG, z64(1), None) is None
    assert vdaf_native.core().ntt(1, z128(0), BIG, z128(1), z128(1)) is None


# Each of these looped 2^62 times (or through 2^62 twiddles) before the checks;
# a fresh interpreter with a deadline turns that hang into a failure.
PROMPT: dict[str, str] = {
    "weighted_rows, 2^62 empty rows, Field64": "F.weighted_rows(0, z64(0), z64(0), z64(0), BIG)",
    "weighted_rows, 2^62 empty rows, Field128": (
        "F.weighted_rows(1, z128(0), z128(0), z128(0), BIG)"
    ),
    "shake_rows, 2^62 rows of no output": "F.shake_rows(((bytes(16), 0, 0, 0),), BIG, bytearray())",
    "bit_check_at, 2 x chunk x rows wraps": (
        "F.bit_check_at(1, z128(2), z128(2), z128(1), z128(4), BIG + 1, 1, z128(4), 2)"
    ),
}

_PROMPT_SCRIPT = """
import numpy as np
from svtagg.vdaf import _field as F
BIG = 1 << 62
def z64(n): return np.zeros(n, dtype=np.uint64)
def z128(n): return np.zeros(2 * n, dtype=np.uint64)
try:
    {call}
except ValueError:
    print("refused")
else:
    print("done")
"""


@needs_field
@pytest.mark.parametrize("case", sorted(PROMPT))
def test_counts_no_buffer_backs_do_not_hang(case: str) -> None:
    """An empty output is nothing to compute (`done`), an overflowing shape is
    refused (`refused`); either within seconds."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", _PROMPT_SCRIPT.format(call=PROMPT[case])],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: still running after 30 s")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() in ("done", "refused"), run.stdout


def _at_odd_address(data: bytes, shift: int) -> memoryview:
    """A writable C-contiguous view of a copy of `data` starting `shift` bytes
    (1..7) past an 8-byte boundary."""
    raw = bytearray(len(data) + 16)
    start = (-np.frombuffer(raw, dtype=np.uint8).ctypes.data) % 8 + shift
    view = memoryview(raw)[start : start + len(data)]
    view[:] = data
    return view


@needs_field
@pytest.mark.parametrize("fid", [0, 1])
def test_misaligned_field_buffers_give_the_aligned_bytes(fid: int) -> None:
    """Inputs and outputs at every odd offset: the same bytes as numpy's aligned
    arrays (the outputs are written back into the misaligned views)."""
    f = vdaf_native.core()
    rng = np.random.default_rng(17 + fid)
    words = 2 if fid else 1
    n = 16

    def elems(count: int) -> np.ndarray:
        return rng.integers(0, 1 << 63, count * words, dtype=np.uint64)

    a, b, root, x = elems(n), elems(n), elems(1), elems(4)
    for shift in range(1, 8):
        out_ref, out_odd = np.empty_like(a), _at_odd_address(bytes(a.nbytes), shift)
        a_odd, b_odd = _at_odd_address(a.tobytes(), shift), _at_odd_address(b.tobytes(), 8 - shift)
        f.mul(fid, a, b, out_ref)
        f.mul(fid, a_odd, b_odd, out_odd)
        assert out_odd.tobytes() == out_ref.tobytes()

        data_ref, data_odd = a.copy(), _at_odd_address(a.tobytes(), shift)
        f.ntt(fid, data_ref, n, root, None)
        f.ntt(fid, data_odd, n, _at_odd_address(root.tobytes(), shift), None)
        assert data_odd.tobytes() == data_ref.tobytes()

        pow_ref = np.empty(4 * 5 * words, np.uint64)
        pow_odd = _at_odd_address(pow_ref.tobytes(), shift)
        f.powers_rows(fid, x, 1, pow_ref)
        f.powers_rows(fid, _at_odd_address(x.tobytes(), shift), 1, pow_odd)
        assert pow_odd.tobytes() == pow_ref.tobytes()

        raw = _at_odd_address(a.tobytes(), shift)  # sampled in place, as xof.py does
        assert f.sample(fid, raw, raw) == n
        assert raw.tobytes() == a.tobytes()


@needs_gc
def test_ggm_trees_read_noise_positions_at_any_alignment() -> None:
    """fr_ggm's alphas (int64) from a misaligned buffer: the aligned trees."""
    g = mpc_native.core()
    rng = np.random.default_rng(5)
    trees, depth = 3, 4
    known = rng.integers(0, 1 << 63, (trees, depth, 2), dtype=np.uint64)
    phi = rng.integers(0, 1 << 63, (trees, 2), dtype=np.uint64)
    alphas = np.array([0, 5, 15], dtype=np.int64)
    ref = np.empty((trees, 1 << depth, 2), dtype=np.uint64)
    g.fr_ggm(True, depth, 7, known, alphas, phi, ref, None)
    for shift in (1, 3, 4):
        got = np.empty_like(ref)
        g.fr_ggm(True, depth, 7, known, _at_odd_address(alphas.tobytes(), shift), phi, got, None)
        assert np.array_equal(got, ref), shift


@needs_gc
def test_refused_three_halves_tables_leave_the_tables_in_use() -> None:
    """A (Q, R) pair th_tables refuses must not replace the R the evaluator is
    using (it did: copied first, checked after)."""
    from svtagg.mpc.threehalves import Q_TABLE, R_TABLE, layer_blocks

    g = mpc_native.core()
    rng = np.random.default_rng(9)
    n = 16
    a, b = (rng.integers(0, 1 << 63, (n, 2), dtype=np.uint64) for _ in range(2))
    tables = np.zeros((layer_blocks(n), 2), dtype=np.uint64)
    before, after = np.empty((n, 2), np.uint64), np.empty((n, 2), np.uint64)
    g.th_eval_and(a, b, tables, 3, 1, before)
    try:
        with pytest.raises(ValueError):
            g.th_tables(bytes(128), b"\xff" * 128)
        g.th_eval_and(a, b, tables, 3, 1, after)
    finally:
        g.th_tables(Q_TABLE.tobytes(), R_TABLE.tobytes())
    assert np.array_equal(before, after)


@needs_field
@needs_gc
def test_the_fuzzer_finds_nothing_in_a_short_run() -> None:
    """scripts/fuzz_native.py over both cores (sanitize.sh runs it longer, under
    ASan+UBSan): every call returns or raises an ordinary exception."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_native.py"), "--iterations", "3000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert "fuzz_native: 3000 calls" in run.stdout, run.stdout
