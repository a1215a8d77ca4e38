"""The validity circuits a task's reports prove, by name.

A task names one (`TaskParams.validity`); its clients shard every report with
that circuit's Prio3 instance and both servers verify each proof at ingest
(servers/ingest/batches.py).  What each proves about one report, for a task of
dimension d and precision F (values on the grid of 2^F units per user):

- ``range``: every coordinate is an integer in [0, 2^F], i.e. a value in
  [0, 1] at precision F (`RangeVec`: F+1 bits per coordinate, plus a check
  that the top bit excludes every lower one).  Any embedding.
- ``onehot``: exactly one coordinate is 1, the others 0 (Prio3Histogram of
  draft 07).  Heavy hitters where each user holds one item.
- ``multihot:r``: every coordinate is 0 or 1 and at most r of them are 1
  (`MultiHot`); ``multihot`` alone bounds the weight by d, i.e. only the
  0/1 check.  Heavy hitters where a user holds up to r items.
- ``sparse-onehot``: what ``onehot`` proves, uploaded sparse: each report is
  a verifiable DPF key of O(log d) bytes (vdaf/sparse.py: 276 bytes to the
  leader at d = 10⁴, against 167 KB for ``onehot``), which each server
  expands over the whole domain.  Not a Prio3 circuit: no FLP, one exchange
  of 32-byte prep shares per report.
- ``sparse-multihot:r``: what ``multihot:r`` proves, uploaded sparse: each
  report is r verifiable DPF keys over [0, d + r) — the sorted items, padded
  to r past the domain — and two small keys per gap between them (its digits
  in base ⌈√(d + r)⌉), which the servers check add up, so the items are
  distinct (vdaf/sparse.py `SparseMultihot`: 5,244 bytes to the leader at
  d = 10⁴, r = 10, against 167 KB for ``multihot:10``).  r is required.
- ``sparse-range:r``: what ``range`` proves of a row with at most r nonzero
  coordinates, uploaded sparse: the items placed as ``sparse-multihot:r``'s,
  each item's key carrying its value as a second payload, proved in
  [0, 2^F] by digit keys (vdaf/sparse.py `SparseRange`).  r is required.
- ``crawl:B``: each report is one string of B bits (1 ≤ B ≤ 256) as the keys
  of an incremental verifiable DPF (vdaf/crawl.py: 3,120 bytes per server at
  B = 64).  The task has no coordinates (d = 1) and no sums: its reports are
  kept by both servers and walked level by level by the prefix crawl
  (servers/crawl.py), whose checks refuse hostile reports; at ingest both
  servers check the first level (exactly one unit in the root's children).

The 0/1 circuits count users; their sums are scaled by 2^F when folded, so
every task's aggregates are on the same grid (2^F units per user).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.vdaf.circuits import MeasurementError
from svtagg.vdaf.crawl import MAX_BITS as CRAWL_MAX_BITS
from svtagg.vdaf.crawl import PrefixDpf
from svtagg.vdaf.prio3 import (
    Prio3,
    prio3_histogram,
    prio3_multihot,
    prio3_range_vec,
)
from svtagg.vdaf.sparse import KEY_SIZE as SPARSE_KEY_SIZE
from svtagg.vdaf.sparse import MAX_BITS as SPARSE_MAX_BITS
from svtagg.vdaf.sparse import RAND_SIZE as SPARSE_RAND_SIZE
from svtagg.vdaf.sparse import SparseMultihot, SparseOnehot, SparseRange
from svtagg.vdaf.xof import SEED_SIZE

#: The circuit names a task may give, with what each proves.
CIRCUITS = {
    "range": "every coordinate is an integer in [0, 2^F] (a value in [0, 1] at precision F)",
    "onehot": "exactly one coordinate is 1 and every other is 0",
    "multihot": "every coordinate is 0 or 1, and at most r are 1 (multihot:r; r = d if omitted)",
    "sparse-onehot": "exactly one coordinate is 1 and every other is 0, uploaded as a "
    "verifiable DPF key (O(log d) bytes)",
    "sparse-multihot": "every coordinate is 0 or 1, and at most r are 1 (sparse-multihot:r), "
    "uploaded as 3r - 2 verifiable DPF keys (O(r log d) bytes)",
    "sparse-range": "every coordinate is an integer in [0, 2^F], and at most r are nonzero "
    "(sparse-range:r), uploaded as verifiable DPF keys (O(r (log d + F)) bytes)",
    "crawl": "one string of B bits (crawl:B), uploaded as incremental DPF keys walked by the "
    "prefix crawl",
}
#: The circuits that suit an embedding's vectors: the 0/1 circuits only fit
#: embeddings whose values can be 0/1 (heavy hitters, or rows given as they are).
FITS = {
    "": (
        "range",
        "onehot",
        "multihot",
        "sparse-onehot",
        "sparse-multihot",
        "sparse-range",
        "crawl",
    ),
    "vectors": ("range", "onehot", "multihot", "sparse-onehot", "sparse-multihot", "sparse-range"),
    "strings": ("crawl",),
    "heavy_hitters": ("sparse-onehot", "sparse-multihot", "multihot", "onehot", "range"),
}
_NAME = re.compile(
    r"(range|onehot|multihot|sparse-onehot|sparse-multihot|sparse-range|crawl)"
    r"(?::([1-9][0-9]{0,6}))?"
)


class ValidityError(ValueError):
    """A circuit name that does not parse or does not fit the task."""


@dataclass(frozen=True)
class Validity:
    """One task's circuit: its name, the task's d and F, and the weight bound."""

    name: str
    d: int
    frac_bits: int
    max_weight: int = 0
    #: crawl:B: the strings' length in bits.
    bits: int = 0

    @property
    def counts(self) -> bool:
        """The circuit's outputs are 0/1 counts (scaled by 2^F when folded)."""
        return self.name not in ("range", "sparse-range")

    @property
    def scale(self) -> int:
        """What one output unit is worth on the task's grid."""
        return 1 << self.frac_bits if self.counts else 1

    @property
    def one_item(self) -> bool:
        """Each report is one item (onehot, dense or sparse)."""
        return self.name in ("onehot", "sparse-onehot")

    @property
    def crawl(self) -> bool:
        """Reports are strings as incremental DPF keys (vdaf/crawl.py), kept
        for the prefix crawl; nothing is folded into sums."""
        return self.name == "crawl"

    @property
    def prefix_dpf(self) -> PrefixDpf:
        """The crawl's incremental DPF over strings of `bits` bits (crawl only)."""
        if not self.crawl:
            raise ValidityError(f"{self.name} takes no strings")
        return _prefix(self.bits)

    @property
    def sparse(self) -> bool:
        """Reports are sparse DPF keys (vdaf/sparse.py), not Prio3."""
        return self.name in ("sparse-onehot", "sparse-multihot", "sparse-range")

    @property
    def multihot(self) -> bool:
        """At most `max_weight` ones per report (dense or sparse)."""
        return self.name in ("multihot", "sparse-multihot")

    @property
    def max_items(self) -> int:
        """At most this many nonzero coordinates per report (0: no bound)."""
        return self.max_weight if self.multihot or self.name == "sparse-range" else 0

    @property
    def label(self) -> str:
        """The circuit's name as a task gives it (with r where it has one)."""
        return f"{self.name}:{self.max_weight}" if self.max_items else self.name

    @property
    def prio3(self) -> Prio3:
        if self.crawl:
            raise ValidityError("a crawl task takes incremental DPF keys, not Prio3 reports")
        if self.sparse:
            raise ValidityError(f"a {self.name} task takes DPF keys, not Prio3 reports")
        return _instance(self)

    @property
    def scheme(self) -> SparseOnehot | SparseMultihot | SparseRange:
        """The sparse reports' DPF keys over [0, d) (the sparse circuits only)."""
        if not self.sparse:
            raise ValidityError(f"{self.name} takes Prio3 reports")
        return _sparse(self.name, self.d, self.max_weight, self.frac_bits)

    def measurement(self, grid_row: list[int]) -> list[int] | int:
        """A report's measurement from its values on the grid (integers in [0, 2^F])."""
        if not self.counts:
            return grid_row
        unit = 1 << self.frac_bits
        if any(v not in (0, unit) for v in grid_row):
            raise MeasurementError(f"{self.name} takes 0/1 values only")
        if self.one_item:
            ones = [j for j, v in enumerate(grid_row) if v]
            if len(ones) != 1:
                raise MeasurementError(f"{self.name} takes exactly one 1 per row, got {len(ones)}")
            return ones[0]  # Prio3Histogram's measurement: the bucket
        return [v // unit for v in grid_row]

    def measurements(self, grid_rows: Sequence[Sequence[int]] | npt.NDArray[Any]) -> Any:
        """`measurement` of every row, the rows of an integer matrix at once (the
        first row `measurement` refuses is refused, with its message)."""
        if not self.counts:
            return grid_rows
        grid = np.asarray(grid_rows) if len(grid_rows) else None
        if grid is None or grid.ndim != 2 or grid.dtype.kind not in "iu":
            return [self.measurement(list(r)) for r in grid_rows]
        unit = 1 << self.frac_bits
        bad = ~((grid == 0) | (grid == unit)).all(axis=1)
        if self.one_item:
            bad |= np.count_nonzero(grid, axis=1) != 1
        if bad.any():
            self.measurement([int(v) for v in grid[int(np.argmax(bad))]])  # raises
        if self.one_item:
            return np.argmax(grid, axis=1)  # Prio3Histogram's measurements: the buckets
        return (grid // unit).astype(np.int64)

    def shard(
        self,
        grid_rows: Sequence[Sequence[int]] | npt.NDArray[Any],
        nonces: Sequence[bytes],
        rands: Sequence[bytes] | None = None,
    ) -> list[tuple[bytes, bytes, bytes]]:
        """Reports from rows of values on the grid (a list of rows, or an integer
        matrix): (public share, leader's input share, helper's input share)
        encoded, each proving this circuit.  The nonce is the report's id;
        `rands` default to fresh CSPRNG bytes."""
        if self.crawl:
            raise ValidityError("a crawl task's reports are strings: shard_strings")
        items = self.measurements(grid_rows)
        if self.sparse:
            scheme = self.scheme
            rands = rands or [os.urandom(SPARSE_RAND_SIZE) for _ in nonces]
            out = []
            for item, nonce, rand in zip(items, nonces, rands, strict=True):
                public, keys = scheme.gen_measurement(item, nonce, rand)
                out.append((public, keys[0], keys[1]))
            return out
        prio = self.prio3
        out_p = prio.shard_batch_encoded(items, nonces, rands)
        return [(public, shares[0], shares[1]) for public, shares in out_p]

    def shard_strings(
        self, values: Sequence[int], nonces: Sequence[bytes], rands: Sequence[bytes] | None = None
    ) -> list[tuple[bytes, bytes, bytes]]:
        """A crawl task's reports from strings as B-bit integers
        (analyst.crawl.encode_string): (public share, leader's key, helper's
        key) each; `rands` default to fresh CSPRNG bytes."""
        dpf = self.prefix_dpf
        rands = rands or [os.urandom(SPARSE_RAND_SIZE) for _ in nonces]
        out = []
        for value, nonce, rand in zip(values, nonces, rands, strict=True):
            public, keys = dpf.gen(int(value), nonce, rand)
            out.append((public, keys[0], keys[1]))
        return out

    @property
    def rand_size(self) -> int:
        """Random bytes one report's sharding takes."""
        return SPARSE_RAND_SIZE if self.sparse or self.crawl else self.prio3.rand_size

    # -- sizes: what one report costs on the wire and in verification --------
    def public_share_bytes(self) -> int:
        """Exact length of a report's public share (the joint randomness parts;
        a sparse report's DPF corrections)."""
        if self.crawl:
            return self.prefix_dpf.public_share_bytes()
        if self.sparse:
            return self.scheme.public_share_bytes()
        prio = self.prio3
        return SEED_SIZE * prio.shares if prio.uses_joint_rand else 0

    def input_share_bytes(self, agg_id: int) -> int:
        """Exact length of aggregator `agg_id`'s input share: the leader's
        measurement and proof shares in the field, a helper's two seeds; plus
        the blind where the circuit uses joint randomness.  A sparse report's
        input share is one 16-byte DPF key per server."""
        if self.crawl:
            return SPARSE_KEY_SIZE
        if self.sparse:
            return self.scheme.input_share_bytes()
        prio = self.prio3
        blind = SEED_SIZE if prio.uses_joint_rand else 0
        if agg_id == 0:
            return (prio.flp.meas_len + prio.flp.proof_len) * prio.field.encoded_size + blind
        return 2 * SEED_SIZE + blind

    def verify_bytes(self) -> int:
        """An upper estimate of what verifying one report allocates on either
        server: its measurement and proof shares, output share, verifier and
        the query's intermediate rows, each a field element, counted twice
        (a copy is made on the way).  A sparse report allocates little but
        costs a pass over its whole domain: counted as the domain's Field128
        elements, so a batch's work is bounded as the dense path's is.  A
        crawl report's check at ingest is its first level: its public share
        decoded and two nodes."""
        if self.crawl:
            return 2 * self.public_share_bytes()
        if self.sparse:
            scheme = self.scheme
            if isinstance(scheme, SparseMultihot):
                return scheme.verify_bytes()
            return 16 * (1 << scheme.bits)
        flp = self.prio3.flp
        elements = flp.meas_len + flp.proof_len + flp.output_len + flp.verifier_len
        return 2 * elements * self.prio3.field.encoded_size

    def batch_limit(self, max_reports: int, max_message: int, max_verify: int) -> int:
        """The most reports one upload batch of this circuit may hold: at most
        `max_reports`, a leader message within `max_message` bytes (with room
        for ids and framing), and a verification within `max_verify` bytes.
        0 when a single report does not fit (such a task is refused)."""
        per_message = self.input_share_bytes(0) + self.public_share_bytes() + 64
        return max(
            0,
            min(
                max_reports, (max_message - 4096) // per_message, max_verify // self.verify_bytes()
            ),
        )

    def describe(self) -> str:
        what = CIRCUITS[self.name]
        if self.crawl:
            what = what.replace("B bits (crawl:B)", f"{self.bits} bits")
        if self.max_items:
            what = what.replace("r are", f"{self.max_weight} are")
        return what


def parse_validity(text: str, d: int, frac_bits: int, embedding: str = "") -> Validity | None:
    """The circuit `text` names for a task (None for ""); ValidityError if it does
    not parse or does not fit the task's embedding."""
    if not text:
        return None
    m = _NAME.fullmatch(text)
    if m is None:
        raise ValidityError(
            f"unknown validity circuit {text!r}; known: range, onehot, multihot, multihot:r, "
            "sparse-onehot, sparse-multihot:r, sparse-range:r, crawl:B"
        )
    name, weight = m.group(1), m.group(2)
    if name == "crawl":
        return _crawl(text, weight, d, frac_bits, embedding)
    if weight is not None and name not in ("multihot", "sparse-multihot", "sparse-range"):
        raise ValidityError(
            f"only multihot, sparse-multihot and sparse-range take a bound (name:r), got {text!r}"
        )
    if name in ("sparse-multihot", "sparse-range") and weight is None:
        raise ValidityError(
            f"{name} names its bound on a report's items, {name}:r (each report costs "
            f"DPF keys in proportion to r, r of them over the whole domain), got {name!r}"
        )
    fits = FITS.get(embedding, ("range", "sparse-range"))
    if name not in fits:
        raise ValidityError(
            f"validity {name} does not fit embedding {embedding or 'vectors'}; "
            f"use {' or '.join(fits)}"
        )
    max_weight = 0
    if name in ("multihot", "sparse-multihot", "sparse-range"):
        max_weight = d if weight is None else int(weight)
        if not 1 <= max_weight <= d:
            raise ValidityError(f"{name}:r needs 1 <= r <= d={d}, got {max_weight}")
    if name in ("onehot", "sparse-onehot") and d < 2:
        raise ValidityError(f"{name} needs d >= 2")
    if name == "sparse-onehot" and d > 1 << SPARSE_MAX_BITS:
        raise ValidityError(f"sparse-onehot takes d up to 2^{SPARSE_MAX_BITS}")
    if name in ("sparse-multihot", "sparse-range") and d + max_weight > 1 << SPARSE_MAX_BITS:
        raise ValidityError(f"{name}:r takes d + r up to 2^{SPARSE_MAX_BITS}")
    if name == "sparse-range" and frac_bits > 32:
        raise ValidityError(f"sparse-range takes F up to 32, got {frac_bits}")
    return Validity(name, d, frac_bits, max_weight)


def _crawl(text: str, bits: str | None, d: int, frac_bits: int, embedding: str) -> Validity:
    if bits is None or not 1 <= int(bits) <= CRAWL_MAX_BITS:
        raise ValidityError(
            f"a crawl task names its strings' length in bits, crawl:B with 1 <= B <= "
            f"{CRAWL_MAX_BITS} (crawl:64 for strings of up to 8 bytes), got {text!r}"
        )
    if embedding not in ("", "strings"):
        raise ValidityError(f"validity crawl fits embedding strings, not {embedding}")
    if d != 1:
        raise ValidityError(f"a crawl task has no coordinates: d must be 1, got {d}")
    return Validity("crawl", d, frac_bits, 0, int(bits))


@lru_cache(maxsize=8)
def _prefix(bits: int) -> PrefixDpf:
    return PrefixDpf(bits)


@lru_cache(maxsize=32)
def _sparse(
    name: str, d: int, r: int, frac_bits: int
) -> SparseOnehot | SparseMultihot | SparseRange:
    if name == "sparse-range":
        return SparseRange(d, r, frac_bits)
    return SparseMultihot(d, r) if name == "sparse-multihot" else SparseOnehot(d)


@lru_cache(maxsize=32)
def _instance(v: Validity) -> Prio3:
    if v.name == "range":
        return prio3_range_vec(v.d, v.frac_bits)
    if v.name == "onehot":
        return prio3_histogram(v.d, _chunk(v.d))
    return prio3_multihot(v.d, v.max_weight)


def _chunk(calls: int) -> int:
    """A gadget chunk length near √calls (the draft's advice for ParallelSum)."""
    return max(1, int(round(calls**0.5)))
