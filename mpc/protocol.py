"""The two-party comparison protocol: semi-honest Yao between the leader
(garbler) and the helper (evaluator) over an abstract `Channel`.

Per chunk (one `first_yes` or `compare_to_thresholds` call) three messages:
  1. evaluator → garbler: IKNP extension matrix u (16 bytes per input bit),
  2. garbler → evaluator: all garbled tables + output-decoding bits,
  3. evaluator → garbler: the decoded result.
The garbler's inputs need no labels (they enter the circuit as free XORs with
constants it knows), so they never leave it.  Base OTs run once, in `setup`.

Sessions: a `session_id` must be fresh for every garbler/evaluator pair (the
servers use their stream id).  Δ is drawn anew in each `setup`; the tweak of
half h of the AND gate in lane k of layer L is (L·2^32 + 2k + h, 24-bit session
tag ‖ 40-bit chunk counter), unique for every gate of every chunk of the
session, as the tweakable hash requires (see `garble.py`).  Both parties must
call the chunk methods in the same order with the same K.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from svtagg.mpc.aes import Blocks, TweakableHash
from svtagg.mpc.channel import Channel, MemoryChannel
from svtagg.mpc.circuits import (
    bit_planes,
    ctt_circuit,
    ctt_outcomes,
    first_yes_circuit,
    first_yes_index,
    lane_batches,
)
from svtagg.mpc.garble import EvalBackend, GarbleBackend
from svtagg.mpc.ot import KAPPA, IKNPReceiver, IKNPSender, base_ot_receive, base_ot_send
from svtagg.mpc.ring import RING_BITS, U64

_CHUNK_BITS = 40  # chunk counter width inside the high tweak word
HIGH, LOW, CLOSE = 0, 1, 2


@dataclass
class RunStats:
    """Cost of the last protocol run, from this party's point of view."""

    comparisons: int = 0
    and_gates: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Messages in both directions; each is one flight, so 3 = 1.5 round trips.
    messages: int = 0
    seconds: float = 0.0

    @property
    def round_trips(self) -> float:
        return self.messages / 2


def _as_ring(z: npt.ArrayLike) -> U64:
    arr = np.asarray(z)
    if arr.ndim != 1:
        raise ValueError("expected a 1-D vector of ring elements")
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr)
    if arr.dtype == np.int64:
        return np.ascontiguousarray(arr).view(np.uint64)
    raise TypeError(f"expected uint64 ring elements, got {arr.dtype}")


class _Party:
    def __init__(self, channel: Channel, session_id: bytes) -> None:
        if not session_id:
            raise ValueError("session_id must be non-empty and fresh")
        self.channel = channel
        self.session_id = bytes(session_id)
        self._tag = int.from_bytes(hashlib.sha256(b"svtagg-gc" + self.session_id).digest()[:3])
        self._chunk = 0
        self.hasher = TweakableHash()
        self._workspace: dict[str, Blocks] = {}  # scratch reused across chunks
        self.last_stats = RunStats()
        self._ready = False

    def _next_chunk(self) -> tuple[int, int]:
        """(OT nonce, high tweak word) of the next chunk; both parties count alike."""
        c = self._chunk
        if c >= 1 << _CHUNK_BITS:
            raise RuntimeError("chunk counter exhausted; start a new session")
        self._chunk += 1
        return c, (self._tag << _CHUNK_BITS) | c

    def _require_setup(self) -> None:
        if not self._ready:
            raise RuntimeError("call setup() first")

    def _start(self) -> tuple[int, int, float]:
        return self.channel.bytes_sent, self.channel.bytes_received, time.perf_counter()

    def _finish(
        self, start: tuple[int, int, float], comparisons: int, gates: int, msgs: int
    ) -> None:
        s, r, t = start
        self.last_stats = RunStats(
            comparisons=comparisons,
            and_gates=gates,
            bytes_sent=self.channel.bytes_sent - s,
            bytes_received=self.channel.bytes_received - r,
            messages=msgs,
            seconds=time.perf_counter() - t,
        )


def _decode_index(msg: bytes, k: int) -> int | None:
    if len(msg) != 8:
        raise ValueError("malformed result message")
    v = int.from_bytes(msg, "little", signed=True)
    if not -1 <= v < k:
        raise ValueError("peer returned an impossible index")
    return None if v < 0 else v


class ComparisonGarbler(_Party):
    """The leader's side: garbles, holds Δ and the first share of every input."""

    #: Tests may set these lists to see every tweak / the input 0-labels.
    tweak_log: list[Blocks] | None = None
    input_labels_log: list[Blocks] | None = None

    async def setup(self) -> None:
        """Base OTs (the garbler is the base-OT receiver with choice string s = Δ)."""
        s = [secrets.randbits(1) for _ in range(KAPPA)]
        s[0] = 1  # Δ's point-and-permute bit
        keys = await base_ot_receive(self.channel, s, self.session_id)
        self._iknp = IKNPSender(s, keys)
        self.delta = self._iknp.delta
        self._ready = True

    def _backend(self, lanes: int, u: bytes, tweak_hi: int, nonce: int) -> GarbleBackend:
        widths = [8 * (hi - lo) for lo, hi in lane_batches(lanes)]
        q = self._iknp.labels(u, widths, nonce)
        log = self.input_labels_log

        def source(lo: int, hi: int) -> Blocks:
            labels = next(q)
            if log is not None:
                log.append(labels.copy())
            return labels.reshape(RING_BITS, hi - lo, 2)

        self._source = source
        # 125 ciphertexts per comparison plus < 6 per lane for the chunk logic.
        be = GarbleBackend(
            self.delta,
            self.hasher,
            tweak_hi,
            131 * lanes + 64,
            getattr(self, "_tables", None),
            self._workspace,
        )
        self._tables = be.buffer
        be.tweak_log = self.tweak_log
        return be

    async def first_yes(self, z: npt.ArrayLike) -> int | None:
        """First j with signed(z_L[j] + z_H[j]) ≥ 0, or None. Call with z_L."""
        self._require_setup()
        z_l = _as_ring(z)
        k = z_l.shape[0]
        nonce, hi = self._next_chunk()
        if k == 0:
            return None
        start = self._start()
        be = self._backend(k, await self.channel.recv(), hi, nonce)
        f0 = first_yes_circuit(be, bit_planes(z_l), self._source, k)
        dec = np.packbits(be.decoding(f0), bitorder="little")
        await self.channel.send(be.message(dec))
        result = _decode_index(await self.channel.recv(), k)
        self._finish(start, k, be.and_gates, 3)
        return result

    async def compare_to_thresholds(self, z_high: npt.ArrayLike, z_low: npt.ArrayLike) -> list[int]:
        """Outcomes (0 HIGH, 1 LOW, 2 CLOSE) up to and including the first CLOSE.

        Call with the leader's shares; nothing about later queries is revealed."""
        self._require_setup()
        zh, zl = _as_ring(z_high), _as_ring(z_low)
        if zh.shape != zl.shape:
            raise ValueError("z_high and z_low differ in length")
        k = zh.shape[0]
        nonce, hi = self._next_chunk()
        if k == 0:
            return []
        start = self._start()
        a_bits = bit_planes(np.concatenate([zh, zl]))
        be = self._backend(2 * k, await self.channel.recv(), hi, nonce)
        m0, f0 = ctt_circuit(be, a_bits, self._source, k)
        dec = np.packbits(np.concatenate([be.decoding(m0), be.decoding(f0)]), bitorder="little")
        await self.channel.send(be.message(dec))
        msg = await self.channel.recv()
        out = list(msg)
        if len(out) > k or any(v > CLOSE for v in out) or CLOSE in out[:-1]:
            raise ValueError("peer returned impossible outcomes")
        self._finish(start, 2 * k, be.and_gates, 3)
        return out


class ComparisonEvaluator(_Party):
    """The helper's side: obtains its input labels by OT and evaluates."""

    #: Tests may set these lists to see the evaluator's whole view.
    label_log: list[Blocks] | None = None
    input_labels_log: list[Blocks] | None = None

    async def setup(self) -> None:
        """Base OTs (the evaluator is the base-OT sender)."""
        keys = await base_ot_send(self.channel, KAPPA, self.session_id)
        self._iknp = IKNPReceiver(keys)
        self._ready = True

    async def _send_inputs(self, b: U64, nonce: int) -> None:
        """OT extension message for the evaluator's input bits, lane batch by batch
        (OT position order inside a batch: bit-plane major)."""
        choices = [
            np.packbits(bit_planes(b[lo:hi]).reshape(-1), bitorder="little")
            for lo, hi in lane_batches(b.shape[0])
        ]
        await self.channel.send(self._iknp.u_message(choices, nonce))

    def _backend(self, tables: memoryview, lanes: int, tweak_hi: int, nonce: int) -> EvalBackend:
        widths = [8 * (hi - lo) for lo, hi in lane_batches(lanes)]
        t = self._iknp.labels(widths, nonce)
        log = self.input_labels_log

        def source(lo: int, hi: int) -> Blocks:
            labels = next(t)
            if log is not None:
                log.append(labels.copy())
            return labels.reshape(RING_BITS, hi - lo, 2)

        self._source = source
        be = EvalBackend(self.hasher, tweak_hi, tables, self._workspace)
        be.label_log = self.label_log
        return be

    async def first_yes(self, z: npt.ArrayLike) -> int | None:
        """Same result as the garbler's call. Call with z_H."""
        self._require_setup()
        z_h = _as_ring(z)
        k = z_h.shape[0]
        nonce, hi = self._next_chunk()
        if k == 0:
            return None
        start = self._start()
        await self._send_inputs(z_h, nonce)
        msg = memoryview(await self.channel.recv())
        nd = (k + 7) // 8
        if len(msg) < nd or (len(msg) - nd) % 16:
            raise ValueError("malformed garbled-circuit message")
        be = self._backend(msg[: len(msg) - nd], k, hi, nonce)
        f = first_yes_circuit(be, None, self._source, k)
        be.done()
        dec = np.unpackbits(np.frombuffer(msg[len(msg) - nd :], np.uint8), bitorder="little")[:k]
        result = first_yes_index(be.decode(f, dec))
        code = -1 if result is None else result
        await self.channel.send(code.to_bytes(8, "little", signed=True))
        self._finish(start, k, be.and_gates, 3)
        return result

    async def compare_to_thresholds(self, z_high: npt.ArrayLike, z_low: npt.ArrayLike) -> list[int]:
        """Same outcomes as the garbler's call. Call with the helper's shares."""
        self._require_setup()
        zh, zl = _as_ring(z_high), _as_ring(z_low)
        if zh.shape != zl.shape:
            raise ValueError("z_high and z_low differ in length")
        k = zh.shape[0]
        nonce, hi = self._next_chunk()
        if k == 0:
            return []
        start = self._start()
        await self._send_inputs(np.concatenate([zh, zl]), nonce)
        msg = memoryview(await self.channel.recv())
        nd = (2 * k + 7) // 8
        if len(msg) < nd or (len(msg) - nd) % 16:
            raise ValueError("malformed garbled-circuit message")
        be = self._backend(msg[: len(msg) - nd], 2 * k, hi, nonce)
        m, f = ctt_circuit(be, None, self._source, k)
        be.done()
        dec = np.unpackbits(np.frombuffer(msg[len(msg) - nd :], np.uint8), bitorder="little")
        out = ctt_outcomes(be.decode(m, dec[:k]), be.decode(f, dec[k : 2 * k]))
        await self.channel.send(bytes(out))
        self._finish(start, 2 * k, be.and_gates, 3)
        return out


async def connected_pair(
    session_id: bytes | None = None,
) -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    """A garbler and an evaluator joined by a MemoryChannel, with base OTs done."""
    sid = session_id if session_id is not None else secrets.token_bytes(16)
    cg, ce = MemoryChannel.pair()
    g, e = ComparisonGarbler(cg, sid), ComparisonEvaluator(ce, sid)
    await asyncio.gather(g.setup(), e.setup())
    return g, e


async def run_first_yes(z_l: npt.ArrayLike, z_h: npt.ArrayLike) -> int | None:
    """One-process reference: both parties over a MemoryChannel; returns the
    (agreed) first-YES index."""
    g, e = await connected_pair()
    rg, re_ = await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
    if rg != re_:
        raise AssertionError("parties disagree")
    return rg


async def run_compare_to_thresholds(
    z_high_l: npt.ArrayLike, z_low_l: npt.ArrayLike, z_high_h: npt.ArrayLike, z_low_h: npt.ArrayLike
) -> list[int]:
    """One-process reference for CompareToThresholds (leader's shares first)."""
    g, e = await connected_pair()
    rg, re_ = await asyncio.gather(
        g.compare_to_thresholds(z_high_l, z_low_l), e.compare_to_thresholds(z_high_h, z_low_h)
    )
    if rg != re_:
        raise AssertionError("parties disagree")
    return rg
