"""Jointly generated noise on the servers (task option noise = joint).

A joint-noise stream's γ and every query's ν are drawn inside the garbled
circuit (`svtagg.mpc.jointnoise`) from both servers' random bits (os.urandom on
each side): the helper (the garbler) keeps a fresh r, the leader gets ν − r, and
each adds its share exactly where it would add its own independent draw, so the
comparison circuit is unchanged.  The samplers are those
`dp.jointsvt.joint_stream_noise` accounts for: one draw at the kind's central
scale (slightly inflated), not two.

Ahead of time.  The sampler costs ≈ 40× the bytes of the comparison it feeds,
so the leader draws a stream's noise before its chunks need it, in batches (a
`NoiseBatch`, its own chunk kind, on a pooled session): right after the open,
γ and `PoolPolicy.first` samples of ν; after each chunk, enough for another
chunk of that size (`LeaderDriver._want_pool`; a worker of leased work leaves
this to its front end, which runs the batches itself).  It takes the sampler
off the query path when there is time between chunks to run it; back-to-back
chunks are still bounded by its rate.  Each server keeps its
shares of a stream's pool in its store (`servers/store/jointpool.py`): its own
secret share, as sensitive as its own independent draw.  An Ask chunk then
names, in its header (`PoolDraw`), the samples it consumes: ν of its first
`count` queries are the pool's samples [lo, lo + count), the rest are drawn in
the chunk as before (the fallback: an empty or short pool, e.g. while a batch
is still running — the front end first waits for a batch already under way —
or a leader that fills no pool, `noise_pool = None`); its first chunk's γ
comes from the pool if the pool holds it, else it is drawn in that chunk.

Why no share is ever used twice, by either server:
- a batch reserves its sequence numbers durably on both servers before the
  sampler runs (the helper refuses a batch whose numbers it has reserved
  before), so each number is generated once;
- a chunk consumes its samples on each server in one committed (fsynced)
  transaction after its durable `in_chunk` mark and before its comparison:
  they and everything held below them are deleted, and the server's own
  `used` counter moves past them.  The helper checks the leader's range
  against its own counter and refuses one below it (the stream then fails
  closed), so the leader cannot make it reuse a share; a failed chunk has
  consumed its samples, and its stream never answers again anyway;
- a stream that answers no more (closed, failed, interrupted by a restart)
  keeps no shares: deleted at the close or failure, and at recovery.
Why both servers use the same sample for the same lane: the numbers travel in
the headers, and the leader keeps a batch only after the helper's closing
status says the helper has stored it — so a sample the leader holds is held
by the helper under the same number (a batch the leader lost, the helper
keeps unused until the stream ends).  γ: a batch's γ is kept only while the
stream has begun no chunk, and the first chunk either names the pooled γ
(the helper refuses if it holds none) or draws a new one in the chunk, which
replaces any pooled γ never used.
Why the accounting is unchanged: a batch runs the very sampler a chunk runs
(`batch_shares`), with the same shapes.

γ drawn in the chunk: there is no session when a stream opens, so without a
pooled γ it is drawn in the stream's first chunk and each server stores its
share durably (`Store.set_joint_threshold_noise`, committed with an fsync)
before that chunk's comparison runs; later chunks read it.  A first chunk that
fails fails the stream closed on both servers (as every chunk failure does),
so a stream whose γ was never drawn never compares."""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from svtagg.dp.errors import FailedPrecondition, InvalidArgument
from svtagg.dp.jointsvt import (
    JOINT,
    JointStreamNoise,
    check_joint_kind,
    dither_offset,
    joint_stream_noise,
)
from svtagg.dp.kinds import StreamKind, noise_model
from svtagg.mpc.jointnoise import SamplerShape, evaluate_joint_noise, garble_joint_noise
from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler
from svtagg.mpc.ring import RING_BITS, U64
from svtagg.servers.exchange.values import ChunkKind, NoiseBatch
from svtagg.servers.store.rules import StreamState, TaskState


@dataclass(frozen=True)
class JointDraw:
    """One server's shares of the joint noise a chunk used (the test hook's
    record): ν of its first `pooled` queries are the pool's samples numbered
    from `pool_lo`, the rest were drawn in the chunk; `gamma_pooled`: the
    stream's γ came from the pool."""

    stream_id: str
    chunk: int
    gamma: int
    nu: U64
    pool_lo: int = 0
    pooled: int = 0
    gamma_pooled: bool = False

    @classmethod
    def of(cls, stream: StreamState, gamma: int, nu: U64, pooled: Pooled | None) -> JointDraw:
        if pooled is None:
            return cls(stream.stream_id, stream.chunks, gamma, nu)
        p = pooled
        return cls(stream.stream_id, stream.chunks, gamma, nu, p.lo, len(p.nu), p.gamma is not None)


@dataclass(frozen=True)
class Pooled:
    """What a chunk took from its stream's pool on one server, consumed before
    its comparison: the pooled γ share (its first chunk, else None) and the ν
    shares of its first len(nu) queries, the samples numbered from `lo`."""

    gamma: int | None
    nu: U64
    lo: int = 0


@dataclass(frozen=True)
class PoolPolicy:
    """How the leader keeps a joint-noise stream's pool filled ahead of its
    chunks.  After the open: γ and `first` ν.  After each chunk of k queries:
    up to max(`reserve`, k) held samples — enough for another chunk of that
    size — in exchanges of at most `batch` samples (≤ `jointpool.MAX_BATCH`).
    Nobody declares how many queries a stream will ask, so what a stream still
    holds when it ends is discarded: at most max(`reserve`, its last chunk's
    size) samples, generated for nothing."""

    batch: int = 2000
    reserve: int = 0
    first: int = 32


@dataclass(frozen=True)
class PreparePolicy:
    """How the leader makes joint noise again between runs
    (servers/exchange/prepared.py): what the streams of each (task, sampler
    shape) consumed, and `margin` more (a run's needs vary with its noise: a
    repeated top-10 consumed 207,616 then 223,592 samples of its main shape;
    what is left over serves later runs), up to the pool's bound, in batches
    of `batch`, once no chunk (of any task) has run for `idle` seconds."""

    batch: int = 5000
    margin: Fraction = Fraction(1, 4)
    #: Longer than the pauses inside a run (the analyst planning its next
    #: stream), so the noise is made between runs rather than mid-run, where
    #: what it makes is used at once and the next run finds less ready.
    idle: float = 3.0


def stream_noise(kind: StreamKind, epsilon: Fraction, frac_bits: int) -> JointStreamNoise:
    """The samplers of a joint-noise stream, or InvalidArgument: a kind the joint
    sampler does not cover, or an ε it cannot fit."""
    try:
        check_joint_kind(kind)
        noise = joint_stream_noise(kind, epsilon, frac_bits)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    # The comparison width is derived from the independent-noise clamp bounds
    # (two parties' γ and ν); a joint sample lies in [−2^K, 2^K), far inside them.
    if noise.max_magnitude > 2 * noise_model(kind).noise_bound_per_party(epsilon, frac_bits):
        raise InvalidArgument("joint noise would exceed the comparison's overflow bound")
    return noise


def shapes(
    noise: JointStreamNoise, width: int = RING_BITS
) -> tuple[SamplerShape | None, SamplerShape]:
    """(γ's sampler, ν's sampler) for a stream whose comparison width is `width`
    (`ServerCore.comparison_width`: the shares need to be exact mod 2^w only);
    no γ sampler for a tournament (nmax)."""
    c_rho, w_rho = noise.threshold_constants, noise.threshold_widths
    c_nu, w_nu = noise.query_constants, noise.query_widths
    gamma = SamplerShape(c_rho, w_rho, noise.shift, noise.signed, width) if c_rho else None
    return gamma, SamplerShape(c_nu, w_nu, noise.shift, noise.signed, width)


def _dither(n: int, shift: int) -> U64:
    """n uniform values in [0, 2^F) from os.urandom: this server's dither."""
    words = np.frombuffer(os.urandom(8 * n), dtype="<u8").astype(np.uint64)
    return words & np.uint64((1 << shift) - 1)


async def joint_shares(party: object, n: int, shape: SamplerShape) -> U64:
    """This server's additive shares of n joint samples, in the chunk's session:
    the helper's 2^F·r (it garbles), the leader's 2^F·(Z − r) (it evaluates),
    each plus its own dither in [0, 2^F), the leader's less 2^(F−1) for the
    two-sided sampler (`dp.jointsvt.dither_law`): the sum is 2^F·Z plus a
    triangular dither — symmetric about −1 grid unit like the draw itself, or
    ≥ 0 like the one-sided draw (exp3) — so the comparison sees
    noise of the fine grid, not a score rounded down to whole sensitivities.
    Privacy does not rest on the dither (docs/privacy.md)."""
    if isinstance(party, ComparisonGarbler):
        share = await garble_joint_noise(party, n, shape)
        return share + _dither(n, shape.shift) if shape.shift else share
    if isinstance(party, ComparisonEvaluator):
        share = await evaluate_joint_noise(party, n, shape)
        if not shape.shift:
            return share
        offset = np.int64(dither_offset(shape.shift, shape.signed)).astype(np.uint64)
        return share + _dither(n, shape.shift) + offset
    raise FailedPrecondition("joint noise needs the garbled-circuit engine")


def pools_noise(stream: StreamState, task: TaskState) -> bool:
    """Whether the stream's chunks draw joint noise (and so may pool it)."""
    return task.params.noise == JOINT and ChunkKind.of_stream(stream.kind) == ChunkKind.ASK


async def batch_shares(
    party: object, stream: StreamState, task: TaskState, batch: NoiseBatch, width: int
) -> tuple[int | None, U64]:
    """This server's shares of a batch: γ (if asked) and `count` ν, drawn by the
    very sampler a chunk would run (so dp/jointsvt.py's accounting holds), at
    the stream's comparison width."""
    noise = stream_noise(stream.kind, stream.epsilon, task.params.frac_bits)
    gamma_shape, nu_shape = shapes(noise, width)
    assert gamma_shape is not None  # pools hold Ask streams' noise only (`pools_noise`)
    gamma = int((await joint_shares(party, 1, gamma_shape))[0]) if batch.gamma else None
    return gamma, await joint_shares(party, batch.count, nu_shape)


async def prepared_shares(
    party: object, task: TaskState, kind: StreamKind, epsilon: Fraction, count: int, width: int
) -> U64:
    """This server's shares of `count` ν samples of a (kind, ε) stream of
    `task` (servers/exchange/prepared.py): the very sampler its chunks run."""
    _, nu_shape = shapes(stream_noise(kind, epsilon, task.params.frac_bits), width)
    return await joint_shares(party, count, nu_shape)
