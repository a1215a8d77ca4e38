"""Backend selection: the native core (`svtagg.mpc._gc`, AES-NI, built from
`mpc/_gc.c` during `pip install` where a compiler is available) or the numpy
reference.

Both produce the same bytes on the wire: the native core computes the same
fixed-key AES hash, the same half-gates tables in the same order with the same
tweaks, and the same IKNP transpose; `tests/test_mpc_native.py` checks every
operation of one against the other.

`SVTAGG_BACKEND` chooses at import: `auto` (default: native when it loads),
`native` (fail if it does not) or `numpy`.  `use()` switches in-process, for
tests and side-by-side benchmarks; parties pick their backend when they are
created, so switch before building them.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.mpc.aes import FIXED_KEY, Blocks
from svtagg.mpc.garble import Bits, EvalBackend, GarbleBackend
from svtagg.mpc.threehalves import (
    Q_TABLE,
    R_TABLE,
    STEP,
    ThreeHalvesEvalBackend,
    ThreeHalvesGarbleBackend,
    check_scheme,
    layer_blocks,
)

log = logging.getLogger(__name__)

_gc: ModuleType | None = None
_load_error: str | None = None
try:
    from svtagg.mpc import _gc as _loaded  # type: ignore[attr-defined,unused-ignore]

    _loaded.set_key(FIXED_KEY)
    _loaded.th_tables(Q_TABLE.tobytes(), R_TABLE.tobytes())
    _gc = _loaded
except ImportError as exc:  # not built here, or a CPU without AES-NI
    _load_error = str(exc) or type(exc).__name__

BACKENDS = ("native", "numpy")
_active = "numpy"
_thread_count = 1


def available() -> bool:
    """Whether the native core loaded on this machine."""
    return _gc is not None


def use(name: str) -> str:
    """Select `native`, `numpy` or `auto`; returns the backend now active."""
    global _active
    if name not in (*BACKENDS, "auto"):
        raise ValueError(f"unknown backend {name!r}; choose native, numpy or auto")
    if name == "native" and _gc is None:
        raise RuntimeError(f"the native core is not available: {_load_error}")
    _active = "native" if name == "auto" and _gc is not None else name
    if name == "auto" and _gc is None:
        _active = "numpy"
    return _active


def active() -> str:
    """`native` or `numpy`."""
    return _active


def describe() -> str:
    """One line naming the active backend and why, for `svtagg --version` and logs."""
    if _active == "native" and _gc is not None:
        feats = _gc.features()
        aes = "VAES (AVX-512)" if feats["active_vaes"] else "AES-NI"
        return f"native ({aes}, {_thread_count} thread{'s' if _thread_count > 1 else ''})"
    if _gc is None:
        return f"numpy (native core unavailable: {_load_error})"
    return "numpy (selected)"


def set_vaes(on: bool) -> bool:
    """Use the four-block VAES path where the CPU has it (default on); returns the state."""
    if _gc is None:
        return False
    return bool(_gc.set_vaes(on))


def set_threads(n: int | None = None) -> int:
    """Threads the native core splits a carry chain (and a transpose wider than
    2^17 columns) over (None: one per CPU); returns the count in use (1
    without the core).  The output bytes do not depend on it."""
    global _thread_count
    if _gc is None:
        return 1
    want = n if n is not None else (os.cpu_count() or 1)
    _thread_count = int(_gc.set_threads(max(1, min(64, want))))
    return _thread_count


def threads() -> int:
    """Threads in use by the native core (see `set_threads`)."""
    return _thread_count


def core() -> Any:
    """The loaded extension module (callers check `active()` first)."""
    if _gc is None:
        raise RuntimeError(f"the native core is not available: {_load_error}")
    return _gc


_choice = os.environ.get("SVTAGG_BACKEND", "auto").strip().lower() or "auto"
use(_choice)
_threads = os.environ.get("SVTAGG_THREADS", "").strip()
set_threads(int(_threads) if _threads.isdigit() else None)
if _gc is None:
    log.info("svtagg: native comparison core unavailable (%s); using numpy", _load_error)


# ---------------------------------------------------------------- the backends


def _c(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return np.ascontiguousarray(x)


class NativeHash:
    """H(x, i) computed by the native core; same interface as `TweakableHash`."""

    def __call__(self, x: Blocks, tweaks: Blocks, out: Blocks | None = None) -> Blocks:
        n = x.shape[0]
        res = np.empty((n + 1, 2), dtype=np.uint64) if out is None else out
        core().tccr(_c(x), _c(tweaks), res)
        return res[:n]


class _NativeLayers:
    """AND-layer counting shared by the native backends: the same tweak layout
    as `_Common._tweaks`, computed inside the core (and logged when a test asks)."""

    and_layers: int
    tweak_log: list[Blocks] | None
    label_log: list[Any] | None

    def _layer(self, n: int, halves: tuple[int, ...], step: int = 2) -> int:
        if self.tweak_log is not None:
            self._tweaks(n, halves, step)  # type: ignore[attr-defined]
            return self.and_layers - 1
        if n >= (1 << 32) // step:
            raise ValueError("AND layer too wide for the tweak format")
        layer = self.and_layers
        self.and_layers += 1
        return layer

    and_gates: int

    def _chain(self, n: int, width: int) -> tuple[int, Blocks]:
        """Account a fused carry chain of n lanes (width − 1 AND layers, as the
        gate-by-gate path counts them): its first layer and its output buffer."""
        layer0 = self.and_layers
        self.and_layers += width - 1
        self.and_gates += (width - 1) * n
        return layer0, np.empty((n, 2), dtype=np.uint64)

    def _fused_ok(self) -> bool:
        # Tests that log every wire or tweak need the gate-by-gate path.
        return self.label_log is None and self.tweak_log is None


class NativeGarbleBackend(_NativeLayers, GarbleBackend):
    """The garbler with its AND layers and carry chains in the native core."""

    def and_(self, a0: Blocks, b0: Blocks) -> Blocks:
        n = a0.shape[0]
        layer = self._layer(n, (0, 0, 1, 1))
        tab = self._alloc(2 * n)
        c0 = np.empty((n, 2), dtype=np.uint64)
        core().garble_and(_c(a0), _c(b0), self.delta, int(self.tweak_hi), layer, c0, tab)
        self.and_gates += n
        return self._log(c0)

    def and_const(self, bits: Bits | None, b0: Blocks) -> Blocks:
        assert bits is not None
        n = b0.shape[0]
        layer = self._layer(n, (0, 0))
        tab = self._alloc(n)
        out = np.empty((n, 2), dtype=np.uint64)
        core().garble_and_const(
            _c(bits.astype(np.uint8, copy=False)),
            _c(b0),
            self.delta,
            int(self.tweak_hi),
            layer,
            out,
            tab,
        )
        self.and_gates += n
        return self._log(out)

    def sign_batch(self, a_bits: Bits | None, b: Blocks, width: int) -> Blocks | None:
        """The whole carry chain of one lane batch in one call (None: use the gates)."""
        if not self._fused_ok() or a_bits is None:
            return None
        n = b.shape[1]
        layer0, yes = self._chain(n, width)
        tab = self._alloc((2 * width - 3) * n)
        core().garble_sign(
            _c(a_bits[:width]), _c(b), self.delta, int(self.tweak_hi), layer0, width, yes, tab
        )
        return yes

    def or_chain_fused(self, x: Blocks) -> Blocks | None:
        """The linear prefix OR (`chain.or_chain`) in one call (None: the reference path)."""
        if not self._fused_ok():
            return None
        n = x.shape[0] - 1
        layer = self._layer(n, (0, 0, 1, 1))
        tab = self._alloc(2 * n)
        p = np.empty_like(x)
        core().chain_garble(_c(x), self.delta, int(self.tweak_hi), layer, p, tab)
        self.and_gates += n
        return p


class NativeEvalBackend(_NativeLayers, EvalBackend):
    """The evaluator with its AND layers and carry chains in the native core."""

    def and_(self, a: Blocks, b: Blocks) -> Blocks:
        n = a.shape[0]
        layer = self._layer(n, (0, 1))
        tab = self._take(2 * n)
        c = np.empty((n, 2), dtype=np.uint64)
        core().eval_and(_c(a), _c(b), tab, int(self.tweak_hi), layer, c)
        self.and_gates += n
        return self._log(c)

    def and_const(self, bits: Bits | None, b: Blocks) -> Blocks:
        n = b.shape[0]
        layer = self._layer(n, (0,))
        tab = self._take(n)
        out = np.empty((n, 2), dtype=np.uint64)
        core().eval_and_const(_c(b), tab, int(self.tweak_hi), layer, out)
        self.and_gates += n
        return self._log(out)

    def sign_batch(self, a_bits: Bits | None, b: Blocks, width: int) -> Blocks | None:
        if not self._fused_ok():
            return None
        n = b.shape[1]
        layer0, yes = self._chain(n, width)
        tab = self._take((2 * width - 3) * n)
        core().eval_sign(_c(b), tab, int(self.tweak_hi), layer0, width, yes)
        return yes

    def or_chain_fused(self, x: Blocks) -> Blocks | None:
        if not self._fused_ok():
            return None
        n = x.shape[0] - 1
        layer = self._layer(n, (0, 1))
        tab = self._take(2 * n)
        p = np.empty_like(x)
        core().chain_eval(_c(x), tab, int(self.tweak_hi), layer, p)
        self.and_gates += n
        return p


def transpose_rows_native(mat: npt.NDArray[np.uint8], out: Blocks) -> Blocks:
    """`ot.transpose_rows` in the native core; `mat` may have strided rows."""
    if mat.strides[1] != 1:
        mat = np.ascontiguousarray(mat)
    core().transpose128(mat, out)
    return out


class NativeThreeHalvesGarbleBackend(NativeGarbleBackend, ThreeHalvesGarbleBackend):
    """Three-halves AND layers and carry chains in the native core (the garbler
    half-gate `and_const` as under half-gates)."""

    def and_(self, a0: Blocks, b0: Blocks, rho: Bits | None = None) -> Blocks:
        n = a0.shape[0]
        layer = self._layer(n, (0, 0, 1, 1, 2, 2), STEP)
        rho = _c(np.asarray(self.coins(n) if rho is None else rho, dtype=np.uint8))
        tab = self._alloc(layer_blocks(n))
        c0 = np.empty((n, 2), dtype=np.uint64)
        core().th_garble_and(_c(a0), _c(b0), self.delta, int(self.tweak_hi), layer, rho, c0, tab)
        self.and_gates += n
        return self._log(c0)

    def sign_batch(self, a_bits: Bits | None, b: Blocks, width: int) -> Blocks | None:
        if not self._fused_ok() or a_bits is None:
            return None
        n = b.shape[1]
        layer0, yes = self._chain(n, width)
        rho = _c(np.asarray(self.coins((width - 2) * n), dtype=np.uint8))
        tab = self._alloc(n + (width - 2) * layer_blocks(n))
        core().th_garble_sign(
            _c(a_bits[:width]), _c(b), self.delta, int(self.tweak_hi), layer0, width, rho, yes, tab
        )
        return yes

    def or_chain_fused(self, x: Blocks) -> Blocks | None:
        if not self._fused_ok():
            return None
        n = x.shape[0] - 1
        layer = self._layer(n, (0, 0, 1, 1, 2, 2), STEP)
        rho = _c(np.asarray(self.coins(n), dtype=np.uint8))
        tab = self._alloc(layer_blocks(n))
        p = np.empty_like(x)
        core().th_chain_garble(_c(x), self.delta, int(self.tweak_hi), layer, rho, p, tab)
        self.and_gates += n
        return p


class NativeThreeHalvesEvalBackend(NativeEvalBackend, ThreeHalvesEvalBackend):
    """The three-halves evaluator in the native core."""

    def and_(self, a: Blocks, b: Blocks) -> Blocks:
        n = a.shape[0]
        layer = self._layer(n, (0, 1, 2), STEP)
        tab = self._take(layer_blocks(n))
        c = np.empty((n, 2), dtype=np.uint64)
        core().th_eval_and(_c(a), _c(b), tab, int(self.tweak_hi), layer, c)
        self.and_gates += n
        return self._log(c)

    def sign_batch(self, a_bits: Bits | None, b: Blocks, width: int) -> Blocks | None:
        if not self._fused_ok():
            return None
        n = b.shape[1]
        layer0, yes = self._chain(n, width)
        tab = self._take(n + (width - 2) * layer_blocks(n))
        core().th_eval_sign(_c(b), tab, int(self.tweak_hi), layer0, width, yes)
        return yes

    def or_chain_fused(self, x: Blocks) -> Blocks | None:
        if not self._fused_ok():
            return None
        n = x.shape[0] - 1
        layer = self._layer(n, (0, 1, 2), STEP)
        tab = self._take(layer_blocks(n))
        p = np.empty_like(x)
        core().th_chain_eval(_c(x), tab, int(self.tweak_hi), layer, p)
        self.and_gates += n
        return p


def backends(
    engine: str, scheme: str = "halfgates"
) -> tuple[type[GarbleBackend], type[EvalBackend]]:
    """The garbler and evaluator backend classes of an engine and a garbling
    scheme ("halfgates" or "threehalves")."""
    if check_scheme(scheme) == "halfgates":
        if engine == "native":
            return NativeGarbleBackend, NativeEvalBackend
        return GarbleBackend, EvalBackend
    if engine == "native":
        return NativeThreeHalvesGarbleBackend, NativeThreeHalvesEvalBackend
    return ThreeHalvesGarbleBackend, ThreeHalvesEvalBackend
