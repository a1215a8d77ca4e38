"""Backend selection for svtagg.vdaf: the native field core (`svtagg.vdaf._field`,
built from `vdaf/_field.c` during `pip install` where a C compiler is
available) or the pure-Python reference (Python integers in numpy object
arrays).

Both produce the same bytes: the native core stores every element canonically
in its little-endian encoding and computes the same values (field operations,
the same NTT butterflies, the same rejection sampling); tests/test_vdaf_native.py
and the draft-07 vectors run on both and compare them.

`SVTAGG_VDAF_BACKEND` chooses at import: `auto` (default: native when it
loads), `native` (fail if it does not) or `python`.  `use()` switches
in-process, for tests and side-by-side benchmarks.  The backend decides the
representation of new vectors (Field64: uint64 array; Field128: a structured
(lo, hi) uint64 array; Python: object array); operations follow the
representation of their operands, so a vector made under one backend keeps
working after a switch, but vectors of the two kinds must not be mixed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_core: ModuleType | None = None
_load_error: str | None = None
try:
    from svtagg.vdaf import _field as _loaded  # type: ignore[attr-defined,unused-ignore]

    _core = _loaded
except ImportError as exc:  # not built here (no compiler at install time)
    _load_error = str(exc) or type(exc).__name__

BACKENDS = ("native", "python")
_active = "python"


def available() -> bool:
    """Whether the native field core loaded on this machine."""
    return _core is not None


def use(name: str) -> str:
    """Select `native`, `python` or `auto`; returns the backend now active."""
    global _active
    if name not in (*BACKENDS, "auto"):
        raise ValueError(f"unknown backend {name!r}; choose native, python or auto")
    if name == "native" and _core is None:
        raise RuntimeError(f"the native field core is not available: {_load_error}")
    if name == "auto":
        name = "native" if _core is not None else "python"
    _active = name
    return _active


def active() -> str:
    """`native` or `python`."""
    return _active


def describe() -> str:
    """One line naming the active backend and why."""
    if _active == "native":
        return "native (svtagg.vdaf._field)"
    if _core is None:
        return f"python (native field core unavailable: {_load_error})"
    return "python (selected)"


@contextmanager
def using(name: str) -> Iterator[str]:
    """`use(name)` for the duration of a with-block, then the previous backend."""
    before = _active
    try:
        yield use(name)
    finally:
        use(before)


def core() -> Any:
    """The loaded extension module."""
    if _core is None:
        raise RuntimeError(f"the native field core is not available: {_load_error}")
    return _core


use(os.environ.get("SVTAGG_VDAF_BACKEND", "auto").strip().lower() or "auto")
if _core is None:
    log.info("svtagg.vdaf: native field core unavailable (%s); using Python integers", _load_error)
