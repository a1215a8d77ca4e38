"""Prio3 (draft-irtf-cfrg-vdaf-07 §7.2): sharding with a validity proof, one-round
preparation, aggregation and unsharding, with XofShake128 and the generic FLP.

The Client splits its encoded measurement and proof additively: the Leader
(aggregator 0) gets explicit vectors, each Helper two 16-byte XOF seeds.  For
circuits with joint randomness (all but Count) the Client commits to
every share with a blinded "joint randomness part"; the proof is bound (Fiat–
Shamir) to the seed derived from all parts, and the aggregators recompute
their own parts and check the Client's seed in `prep_next`.  Each aggregator
turns its shares into a verifier share; the verifier shares add up to the
verifier, which `decide` accepts only for a valid measurement.

Messages are the draft's encodings (§7.2.6), byte for byte: `encode_*` and
`decode_*` below.  The rand/verify-key inputs must come from a CSPRNG
(`os.urandom`); tests pass the draft's fixed test-vector bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from svtagg.vdaf.circuits import Count, Histogram, Sum, SumVec
from svtagg.vdaf.field import Vec
from svtagg.vdaf.flp import FlpGeneric, Valid
from svtagg.vdaf.ranged import MultiHot, RangeVec
from svtagg.vdaf.xof import SEED_SIZE, XofShake128, expand_rows, format_dst

NONCE_SIZE = 16
#: Reports per internal step of prep_init_batch: big enough that per-call
#: overhead is spread thin, small enough that a step's wire matrices
#: (arity × reports × P elements) stay a few MB.
_PREP_BATCH = 256
#: The same for shard_batch, whose wire matrices are twice as long (the gadget
#: polynomial's 2P points); 32–256 measured within noise of each other.
_SHARD_BATCH = 64
VERIFY_KEY_SIZE = SEED_SIZE

# Algorithm IDs of this project's own Prio3 instances (vdaf/ranged.py).  They are
# not in draft 07; the draft reserves 0xFFFF0000–0xFFFFFFFF for private use, and
# these two are taken from that range, so no registered codepoint is reused.
ALGORITHM_ID_RANGE_VEC = 0xFFFF5301
ALGORITHM_ID_MULTIHOT = 0xFFFF5302

# XOF usages (draft §7.2.5)
USAGE_MEAS_SHARE = 1
USAGE_PROOF_SHARE = 2
USAGE_JOINT_RANDOMNESS = 3
USAGE_PROVE_RANDOMNESS = 4
USAGE_QUERY_RANDOMNESS = 5
USAGE_JOINT_RAND_SEED = 6
USAGE_JOINT_RAND_PART = 7


class VerifyError(ValueError):
    """A report that fails preparation: the proof is rejected or the joint randomness
    the Client used is not the one its shares commit to (draft: ERR_VERIFY)."""


@dataclass(frozen=True)
class InputShare:
    """One aggregator's input share.  The Leader's carries vectors (`meas`, `proof`);
    a Helper's carries the seeds they expand from (`meas_seed`, `proof_seed`)."""

    meas: Vec | None = None
    proof: Vec | None = None
    meas_seed: bytes | None = None
    proof_seed: bytes | None = None
    blind: bytes | None = None


@dataclass(frozen=True)
class PrepShare:
    verifier: Vec
    joint_rand_part: bytes | None


@dataclass(frozen=True)
class PrepState:
    out_share: Vec
    corrected_joint_rand_seed: bytes | None


class Prio3:
    """One Prio3 instance: a validity circuit, its algorithm ID and the number of shares."""

    def __init__(self, valid: Valid, algorithm_id: int, shares: int = 2) -> None:
        if not 2 <= shares < 256:
            raise ValueError(f"Prio3 runs with 2 to 255 aggregators, got {shares}")
        self.flp = FlpGeneric(valid)
        self.field = valid.field
        self.algorithm_id = algorithm_id
        self.shares = shares
        self.uses_joint_rand = self.flp.joint_rand_len > 0
        seeds = 1 + 2 * (shares - 1) + (shares if self.uses_joint_rand else 0)
        self.rand_size = seeds * SEED_SIZE

    # -- auxiliary functions (draft §7.2.5) ------------------------------------------
    def _dst(self, usage: int) -> bytes:
        return format_dst(0, self.algorithm_id, usage)

    def _expand(self, seed: bytes, usage: int, binder: bytes, length: int) -> Vec:
        return XofShake128.expand_into_vec(self.field, seed, self._dst(usage), binder, length)

    def helper_meas_share(self, agg_id: int, seed: bytes) -> Vec:
        return self._expand(seed, USAGE_MEAS_SHARE, bytes([agg_id]), self.flp.meas_len)

    def helper_proof_share(self, agg_id: int, seed: bytes) -> Vec:
        return self._expand(seed, USAGE_PROOF_SHARE, bytes([agg_id]), self.flp.proof_len)

    def prove_rand(self, seed: bytes) -> Vec:
        return self._expand(seed, USAGE_PROVE_RANDOMNESS, b"", self.flp.prove_rand_len)

    def query_rand(self, verify_key: bytes, nonce: bytes) -> Vec:
        return self._expand(verify_key, USAGE_QUERY_RANDOMNESS, nonce, self.flp.query_rand_len)

    def joint_rand_part(self, agg_id: int, blind: bytes, meas_share: Vec, nonce: bytes) -> bytes:
        """An aggregator's commitment to its measurement share, bound to the nonce."""
        binder = bytes([agg_id]) + nonce + self.field.encode_vec(meas_share)
        return XofShake128.derive_seed(blind, self._dst(USAGE_JOINT_RAND_PART), binder)

    def joint_rand_seed(self, parts: Sequence[bytes]) -> bytes:
        return XofShake128.derive_seed(
            bytes(SEED_SIZE), self._dst(USAGE_JOINT_RAND_SEED), b"".join(parts)
        )

    def joint_rand(self, seed: bytes) -> Vec:
        return self._expand(seed, USAGE_JOINT_RANDOMNESS, b"", self.flp.joint_rand_len)

    # -- sharding (Client; draft §7.2.1) ---------------------------------------------
    def shard(
        self, measurement: object, nonce: bytes, rand: bytes | None = None
    ) -> tuple[list[bytes] | None, list[InputShare]]:
        """(public share, input shares) for one measurement.  `rand` defaults to fresh
        CSPRNG bytes; a fixed value is for test vectors only."""
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"the nonce is {NONCE_SIZE} bytes, got {len(nonce)}")
        rand = os.urandom(self.rand_size) if rand is None else rand
        if len(rand) != self.rand_size:
            raise ValueError(f"sharding takes {self.rand_size} random bytes, got {len(rand)}")
        seeds = [rand[i : i + SEED_SIZE] for i in range(0, self.rand_size, SEED_SIZE)]
        meas = self.flp.encode(measurement)
        return self.shard_encoded(meas, nonce, seeds)

    def shard_encoded(
        self, meas: Vec, nonce: bytes, seeds: Sequence[bytes]
    ) -> tuple[list[bytes] | None, list[InputShare]]:
        """Sharding of an already encoded measurement (the draft's two shard variants)."""
        f, helpers = self.field, self.shares - 1
        per_helper = 3 if self.uses_joint_rand else 2
        helper_seeds = [seeds[per_helper * j : per_helper * (j + 1)] for j in range(helpers)]
        rest = seeds[per_helper * helpers :]
        leader_blind = rest[0] if self.uses_joint_rand else None
        prove_seed = rest[-1]

        leader_meas = meas
        parts: list[bytes] = []
        for j, hs in enumerate(helper_seeds):
            share = self.helper_meas_share(j + 1, hs[0])
            leader_meas = f.sub(leader_meas, share)
            if self.uses_joint_rand:
                parts.append(self.joint_rand_part(j + 1, hs[2], share, nonce))
        joint_rand = f.zeros(0)
        public_share = None
        if leader_blind is not None:
            parts.insert(0, self.joint_rand_part(0, leader_blind, leader_meas, nonce))
            joint_rand = self.joint_rand(self.joint_rand_seed(parts))
            public_share = parts

        leader_proof = self.flp.prove(meas, self.prove_rand(prove_seed), joint_rand)
        for j, hs in enumerate(helper_seeds):
            leader_proof = f.sub(leader_proof, self.helper_proof_share(j + 1, hs[1]))

        input_shares = [InputShare(meas=leader_meas, proof=leader_proof, blind=leader_blind)]
        for hs in helper_seeds:
            blind = hs[2] if self.uses_joint_rand else None
            input_shares.append(InputShare(meas_seed=hs[0], proof_seed=hs[1], blind=blind))
        return public_share, input_shares

    def shard_batch(
        self,
        measurements: Sequence[object],
        nonces: Sequence[bytes],
        rands: Sequence[bytes] | None = None,
    ) -> list[tuple[list[bytes] | None, list[InputShare]]]:
        """`shard` for many measurements (a client uploading many rows): entry i is
        shard(measurements[i], nonces[i], rands[i]) byte for byte.  Each `rands`
        entry defaults to fresh CSPRNG bytes; fixed values are for tests only.

        The XOF expansions are decoded per batch, the circuit runs over the
        (reports × length) matrix and each gadget polynomial is one batched NTT
        pipeline (`FlpGeneric.prove_batch`); the SHAKE streams stay one per report.
        """
        rows = len(measurements)
        if len(nonces) != rows or (rands is not None and len(rands) != rows):
            raise ValueError("one nonce (and rand, if given) per measurement")
        if any(len(n) != NONCE_SIZE for n in nonces):
            raise ValueError(f"the nonce is {NONCE_SIZE} bytes")
        rand_list = [os.urandom(self.rand_size) for _ in range(rows)] if rands is None else rands
        if any(len(r) != self.rand_size for r in rand_list):
            raise ValueError(f"sharding takes {self.rand_size} random bytes per report")
        out: list[tuple[list[bytes] | None, list[InputShare]]] = []
        for start in range(0, rows, _SHARD_BATCH):
            end = min(rows, start + _SHARD_BATCH)
            meas = np.stack([self.flp.encode(m) for m in measurements[start:end]])
            seeds = [
                [r[i : i + SEED_SIZE] for i in range(0, self.rand_size, SEED_SIZE)]
                for r in rand_list[start:end]
            ]
            out.extend(self._shard_rows(meas.reshape(end - start, -1), nonces[start:end], seeds))
        return out

    def _shard_rows(
        self, meas: Vec, nonces: Sequence[bytes], seeds: Sequence[Sequence[bytes]]
    ) -> list[tuple[list[bytes] | None, list[InputShare]]]:
        f, flp, rows = self.field, self.flp, len(nonces)
        helpers = self.shares - 1
        per_helper = 3 if self.uses_joint_rand else 2
        leader_meas = meas
        parts: list[list[bytes]] = [[] for _ in range(rows)]
        for j in range(helpers):
            binders = [bytes([j + 1])] * rows
            share = self._expand_rows(
                [s[per_helper * j] for s in seeds], USAGE_MEAS_SHARE, binders, flp.meas_len
            )
            leader_meas = f.sub(leader_meas, share)
            if self.uses_joint_rand:
                self._append_parts(
                    parts, j + 1, [s[per_helper * j + 2] for s in seeds], share, nonces
                )
        rest = per_helper * helpers
        joint_rand = f.zeros_as(meas, rows, 0)
        publics: list[list[bytes] | None] = [None] * rows
        if self.uses_joint_rand:
            leader_parts: list[list[bytes]] = [[] for _ in range(rows)]
            self._append_parts(leader_parts, 0, [s[rest] for s in seeds], leader_meas, nonces)
            for i in range(rows):
                parts[i].insert(0, leader_parts[i][0])
                publics[i] = parts[i]
            joint_rand = self._expand_rows(
                [self.joint_rand_seed(p) for p in parts],
                USAGE_JOINT_RANDOMNESS,
                [b""] * rows,
                flp.joint_rand_len,
            )
        prove_rand = self._expand_rows(
            [s[-1] for s in seeds], USAGE_PROVE_RANDOMNESS, [b""] * rows, flp.prove_rand_len
        )
        leader_proof = flp.prove_batch(meas, prove_rand, joint_rand)
        for j in range(helpers):
            leader_proof = f.sub(
                leader_proof,
                self._expand_rows(
                    [s[per_helper * j + 1] for s in seeds],
                    USAGE_PROOF_SHARE,
                    [bytes([j + 1])] * rows,
                    flp.proof_len,
                ),
            )
        out = []
        for i in range(rows):
            blind = seeds[i][rest] if self.uses_joint_rand else None
            shares = [InputShare(meas=leader_meas[i], proof=leader_proof[i], blind=blind)]
            for j in range(helpers):
                hs = seeds[i][per_helper * j : per_helper * (j + 1)]
                h_blind = hs[2] if self.uses_joint_rand else None
                shares.append(InputShare(meas_seed=hs[0], proof_seed=hs[1], blind=h_blind))
            out.append((publics[i], shares))
        return out

    def _append_parts(
        self,
        parts: list[list[bytes]],
        agg_id: int,
        blinds: Sequence[bytes],
        meas_shares: Vec,
        nonces: Sequence[bytes],
    ) -> None:
        """Append aggregator `agg_id`'s joint randomness part of each report."""
        dst = self._dst(USAGE_JOINT_RAND_PART)
        encoded = self.field.encode_vec(meas_shares)
        width = len(encoded) // len(nonces)
        for i, (blind, nonce) in enumerate(zip(blinds, nonces, strict=True)):
            binder = bytes([agg_id]) + nonce + encoded[i * width : (i + 1) * width]
            parts[i].append(XofShake128.derive_seed(blind, dst, binder))

    # -- preparation (each Aggregator; draft §7.2.2) ---------------------------------
    def expand_input_share(self, agg_id: int, share: InputShare) -> tuple[Vec, Vec]:
        if agg_id == 0:
            if share.meas is None or share.proof is None:
                raise ValueError("the Leader's input share carries vectors")
            return share.meas, share.proof
        if share.meas_seed is None or share.proof_seed is None:
            raise ValueError("a Helper's input share carries seeds")
        return (
            self.helper_meas_share(agg_id, share.meas_seed),
            self.helper_proof_share(agg_id, share.proof_seed),
        )

    def prep_init(
        self,
        verify_key: bytes,
        agg_id: int,
        nonce: bytes,
        public_share: Sequence[bytes] | None,
        input_share: InputShare,
    ) -> tuple[PrepState, PrepShare]:
        """This aggregator's prep state and prep share (its verifier share and joint
        randomness part), from its input share."""
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise ValueError(f"the verify key is {VERIFY_KEY_SIZE} bytes")
        if not 0 <= agg_id < self.shares:
            raise ValueError(f"aggregator id {agg_id} out of range")
        meas_share, proof_share = self.expand_input_share(agg_id, input_share)
        out_share = self.flp.truncate(meas_share)
        joint_rand = self.field.zeros(0)
        corrected_seed = part = None
        if self.uses_joint_rand:
            if public_share is None or len(public_share) != self.shares:
                raise ValueError("the public share must hold one joint randomness part each")
            if input_share.blind is None:
                raise ValueError("the input share lacks its blind")
            part = self.joint_rand_part(agg_id, input_share.blind, meas_share, nonce)
            parts = list(public_share)
            parts[agg_id] = part
            corrected_seed = self.joint_rand_seed(parts)
            joint_rand = self.joint_rand(corrected_seed)
        verifier = self.flp.query(
            meas_share,
            proof_share,
            self.query_rand(verify_key, nonce),
            joint_rand,
            self.shares,
        )
        return PrepState(out_share, corrected_seed), PrepShare(verifier, part)

    def prep_init_batch(
        self,
        verify_key: bytes,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[Sequence[bytes] | None],
        input_shares: Sequence[InputShare],
    ) -> list[tuple[PrepState, PrepShare]]:
        """`prep_init` for many reports at once (a server verifying an upload batch):
        entry i is what prep_init(verify_key, agg_id, nonces[i], public_shares[i],
        input_shares[i]) returns, byte for byte.

        The XOF expansions are decoded per batch, the circuit runs over the
        (reports × length) matrix and the verifier's NTTs are one batched call
        (`FlpGeneric.query_batch`); the SHAKE streams stay one per report.  A
        malformed input (a share of the wrong kind or a missing blind) raises
        ValueError naming the report; an invalid measurement is not detected
        here but by `prep_shares_to_prep_batch`, report by report.
        """
        rows = len(nonces)
        if not rows == len(public_shares) == len(input_shares):
            raise ValueError("one nonce, public share and input share per report")
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise ValueError(f"the verify key is {VERIFY_KEY_SIZE} bytes")
        if not 0 <= agg_id < self.shares:
            raise ValueError(f"aggregator id {agg_id} out of range")
        out: list[tuple[PrepState, PrepShare]] = []
        for start in range(0, rows, _PREP_BATCH):
            end = min(rows, start + _PREP_BATCH)
            out.extend(
                self._prep_init_rows(
                    verify_key,
                    agg_id,
                    nonces[start:end],
                    public_shares[start:end],
                    input_shares[start:end],
                    start,
                )
            )
        return out

    def _expand_rows(
        self, seeds: Sequence[bytes], usage: int, binders: Sequence[bytes], length: int
    ) -> Vec:
        return expand_rows(self.field, seeds, self._dst(usage), binders, length)

    def _prep_init_rows(
        self,
        verify_key: bytes,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[Sequence[bytes] | None],
        input_shares: Sequence[InputShare],
        first: int,
    ) -> list[tuple[PrepState, PrepShare]]:
        f, flp, rows = self.field, self.flp, len(nonces)
        if any(len(n) != NONCE_SIZE for n in nonces):
            raise ValueError(f"a nonce is {NONCE_SIZE} bytes")
        if agg_id == 0:
            for i, sh in enumerate(input_shares):
                if sh.meas is None or sh.proof is None:
                    raise ValueError(
                        f"report {first + i}: the Leader's input share carries vectors"
                    )
            meas_rows = [sh.meas for sh in input_shares if sh.meas is not None]
            proofs = [sh.proof for sh in input_shares if sh.proof is not None]
            meas = np.stack(meas_rows).reshape(rows, flp.meas_len)
            proof = np.stack(proofs).reshape(rows, flp.proof_len)
        else:
            for i, sh in enumerate(input_shares):
                if sh.meas_seed is None or sh.proof_seed is None:
                    raise ValueError(f"report {first + i}: a Helper's input share carries seeds")
            binders = [bytes([agg_id])] * rows
            meas = self._expand_rows(
                [sh.meas_seed for sh in input_shares],  # type: ignore[misc]
                USAGE_MEAS_SHARE,
                binders,
                flp.meas_len,
            )
            proof = self._expand_rows(
                [sh.proof_seed for sh in input_shares],  # type: ignore[misc]
                USAGE_PROOF_SHARE,
                binders,
                flp.proof_len,
            )
        truncate_batch = getattr(self.flp.valid, "truncate_batch", None)
        if truncate_batch is not None:
            out_shares = truncate_batch(meas)
        else:
            out_shares = [flp.truncate(meas[i]) for i in range(rows)]
        joint_rand = f.zeros_as(meas, rows, 0)
        seeds: list[bytes | None] = [None] * rows
        parts: list[bytes | None] = [None] * rows
        if self.uses_joint_rand:
            dst = self._dst(USAGE_JOINT_RAND_PART)
            encoded = f.encode_vec(meas)
            width = len(encoded) // rows
            for i, (nonce, public, sh) in enumerate(
                zip(nonces, public_shares, input_shares, strict=True)
            ):
                if public is None or len(public) != self.shares:
                    raise ValueError(
                        f"report {first + i}: the public share must hold one joint "
                        "randomness part each"
                    )
                if sh.blind is None:
                    raise ValueError(f"report {first + i}: the input share lacks its blind")
                binder = bytes([agg_id]) + nonce + encoded[i * width : (i + 1) * width]
                part = XofShake128.derive_seed(sh.blind, dst, binder)
                all_parts = list(public)
                all_parts[agg_id] = part
                parts[i], seeds[i] = part, self.joint_rand_seed(all_parts)
            joint_rand = self._expand_rows(
                seeds,  # type: ignore[arg-type]
                USAGE_JOINT_RANDOMNESS,
                [b""] * rows,
                flp.joint_rand_len,
            )
        query_rand = self._expand_rows(
            [verify_key] * rows, USAGE_QUERY_RANDOMNESS, nonces, flp.query_rand_len
        )
        verifiers = flp.query_batch(meas, proof, query_rand, joint_rand, self.shares)
        return [
            (PrepState(out_shares[i], seeds[i]), PrepShare(verifiers[i], parts[i]))
            for i in range(rows)
        ]

    def prep_shares_to_prep_batch(
        self, prep_shares: Sequence[Sequence[PrepShare]]
    ) -> list[bytes | None | VerifyError]:
        """`prep_shares_to_prep` for many reports: entry i is report i's prep message,
        or the VerifyError that prep_shares_to_prep(prep_shares[i]) raises, so a
        rejected report never decides the fate of another."""
        rows = len(prep_shares)
        if rows == 0:
            return []
        if any(len(ps) != self.shares for ps in prep_shares):
            raise ValueError(f"expected {self.shares} prep shares per report")
        f = self.field
        total = None
        for j in range(self.shares):
            col = np.stack([ps[j].verifier for ps in prep_shares]).reshape(rows, -1)
            total = col if total is None else f.add(total, col)
        assert total is not None
        accepted = self.flp.decide_batch(total)
        out: list[bytes | None | VerifyError] = []
        for ok, ps in zip(accepted, prep_shares, strict=True):
            if not ok:
                out.append(VerifyError("the validity proof is rejected"))
            elif not self.uses_joint_rand:
                out.append(None)
            else:
                parts = [p.joint_rand_part for p in ps]
                if any(p is None for p in parts):
                    raise ValueError("a prep share lacks its joint randomness part")
                out.append(self.joint_rand_seed([p for p in parts if p is not None]))
        return out

    def prep_shares_to_prep(self, prep_shares: Sequence[PrepShare]) -> bytes | None:
        """The prep message (the joint randomness seed, or None) once the proof is
        accepted; raises VerifyError if it is not."""
        if len(prep_shares) != self.shares:
            raise ValueError(f"expected {self.shares} prep shares")
        f = self.field
        verifier = f.zeros(self.flp.verifier_len)
        for ps in prep_shares:
            verifier = f.add(verifier, ps.verifier)
        if not self.flp.decide(verifier):
            raise VerifyError("the validity proof is rejected")
        if not self.uses_joint_rand:
            return None
        parts = [ps.joint_rand_part for ps in prep_shares]
        if any(p is None for p in parts):
            raise ValueError("a prep share lacks its joint randomness part")
        return self.joint_rand_seed([p for p in parts if p is not None])

    def prep_next(self, state: PrepState, prep_msg: bytes | None) -> Vec:
        """The output share, if the Client's joint randomness is the one its shares
        commit to."""
        if prep_msg != state.corrected_joint_rand_seed:
            raise VerifyError("joint randomness check failed")
        return state.out_share

    # -- aggregation and unsharding (draft §7.2.3, §7.2.4) ---------------------------
    def aggregate(self, out_shares: Sequence[Vec]) -> Vec:
        agg = self.field.zeros(self.flp.output_len)
        if out_shares:
            agg = self.field.sum(np.stack(out_shares), axis=0)
        return agg

    def unshard(self, agg_shares: Sequence[Vec], num_measurements: int) -> object:
        return self.flp.decode(self.aggregate(agg_shares), num_measurements)

    # -- message encodings (draft §7.2.6) --------------------------------------------
    def encode_public_share(self, public_share: Sequence[bytes] | None) -> bytes:
        return b"" if public_share is None else b"".join(public_share)

    def decode_public_share(self, data: bytes) -> list[bytes] | None:
        if not self.uses_joint_rand:
            if data:
                raise ValueError("this instance has an empty public share")
            return None
        if len(data) != SEED_SIZE * self.shares:
            raise ValueError(f"a public share is {SEED_SIZE * self.shares} bytes")
        return [data[i : i + SEED_SIZE] for i in range(0, len(data), SEED_SIZE)]

    def encode_input_share(self, share: InputShare) -> bytes:
        if share.meas is not None and share.proof is not None:
            out = self.field.encode_vec(share.meas) + self.field.encode_vec(share.proof)
        elif share.meas_seed is not None and share.proof_seed is not None:
            out = share.meas_seed + share.proof_seed
        else:
            raise ValueError("an input share carries vectors or seeds")
        return out + (share.blind or b"")

    def decode_input_share(self, agg_id: int, data: bytes) -> InputShare:
        blind_len = SEED_SIZE if self.uses_joint_rand else 0
        if agg_id > 0:
            if len(data) != 2 * SEED_SIZE + blind_len:
                raise ValueError("a Helper's input share has the wrong length")
            blind = data[2 * SEED_SIZE :] or None
            return InputShare(
                meas_seed=data[:SEED_SIZE], proof_seed=data[SEED_SIZE:32], blind=blind
            )
        size = self.field.encoded_size
        meas_bytes = self.flp.meas_len * size
        body = meas_bytes + self.flp.proof_len * size
        if len(data) != body + blind_len:
            raise ValueError("the Leader's input share has the wrong length")
        return InputShare(
            meas=self.field.decode_vec(data[:meas_bytes]),
            proof=self.field.decode_vec(data[meas_bytes:body]),
            blind=data[body:] or None,
        )

    def encode_prep_share(self, ps: PrepShare) -> bytes:
        return self.field.encode_vec(ps.verifier) + (ps.joint_rand_part or b"")

    def encode_prep_msg(self, msg: bytes | None) -> bytes:
        return msg or b""

    def encode_agg_share(self, agg: Vec) -> bytes:
        return self.field.encode_vec(agg)


# -- the instances (draft §7.4) -----------------------------------------------------


def prio3_count(shares: int = 2) -> Prio3:
    return Prio3(Count(), 0x00000000, shares)


def prio3_sum(bits: int, shares: int = 2) -> Prio3:
    return Prio3(Sum(bits), 0x00000001, shares)


def prio3_sum_vec(length: int, bits: int, chunk_length: int, shares: int = 2) -> Prio3:
    return Prio3(SumVec(length, bits, chunk_length), 0x00000002, shares)


def prio3_histogram(length: int, chunk_length: int, shares: int = 2) -> Prio3:
    return Prio3(Histogram(length, chunk_length), 0x00000003, shares)


def prio3_range_vec(
    length: int, frac_bits: int, chunk_length: int | None = None, shares: int = 2
) -> Prio3:
    """`length` values in [0, 2^frac_bits] each (ours; private-use algorithm ID)."""
    return Prio3(RangeVec(length, frac_bits, chunk_length), ALGORITHM_ID_RANGE_VEC, shares)


def prio3_multihot(
    length: int, max_weight: int, chunk_length: int | None = None, shares: int = 2
) -> Prio3:
    """A 0/1 vector with at most `max_weight` ones (ours; private-use algorithm ID)."""
    return Prio3(MultiHot(length, max_weight, chunk_length), ALGORITHM_ID_MULTIHOT, shares)


def run_prio3(
    vdaf: Prio3, verify_key: bytes, measurements: Sequence[object], nonces: Sequence[bytes]
) -> object:
    """The whole protocol in one process (the draft's run_vdaf): the oracle that a
    distributed deployment is tested against.  Raises VerifyError on a rejected report."""
    out_shares: list[list[Vec]] = [[] for _ in range(vdaf.shares)]
    for m, nonce in zip(measurements, nonces, strict=True):
        public, inputs = vdaf.shard(m, nonce)
        states, prep_shares = [], []
        for j in range(vdaf.shares):
            st, ps = vdaf.prep_init(verify_key, j, nonce, public, inputs[j])
            states.append(st)
            prep_shares.append(ps)
        msg = vdaf.prep_shares_to_prep(prep_shares)
        for j in range(vdaf.shares):
            out_shares[j].append(vdaf.prep_next(states[j], msg))
    agg_shares = [vdaf.aggregate(o) for o in out_shares]
    return vdaf.unshard(agg_shares, len(measurements))
