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

import numpy as np

from svtagg.vdaf.circuits import Count, Histogram, Sum, SumVec
from svtagg.vdaf.field import Vec
from svtagg.vdaf.flp import FlpGeneric, Valid
from svtagg.vdaf.messages import (
    NONCE_SIZE,
    USAGE_JOINT_RAND_PART,
    USAGE_JOINT_RAND_SEED,
    USAGE_JOINT_RANDOMNESS,
    USAGE_MEAS_SHARE,
    USAGE_PROOF_SHARE,
    USAGE_PROVE_RANDOMNESS,
    USAGE_QUERY_RANDOMNESS,
    VERIFY_KEY_SIZE,
    InputShare,
    PrepShare,
    PrepState,
    VerifyError,
)
from svtagg.vdaf.ranged import MultiHot, RangeVec
from svtagg.vdaf.rows import Prio3Rows
from svtagg.vdaf.xof import SEED_SIZE, XofShake128

__all__ = [
    "ALGORITHM_ID_MULTIHOT",
    "ALGORITHM_ID_RANGE_VEC",
    "NONCE_SIZE",
    "VERIFY_KEY_SIZE",
    "InputShare",
    "PrepShare",
    "PrepState",
    "Prio3",
    "VerifyError",
    "prio3_count",
    "prio3_histogram",
    "prio3_multihot",
    "prio3_range_vec",
    "prio3_sum",
    "prio3_sum_vec",
    "run_prio3",
]

# Algorithm IDs of this project's own Prio3 instances (vdaf/ranged.py).  They are
# not in draft 07; the draft reserves 0xFFFF0000–0xFFFFFFFF for private use, and
# these two are taken from that range, so no registered codepoint is reused.
ALGORITHM_ID_RANGE_VEC = 0xFFFF5301
ALGORITHM_ID_MULTIHOT = 0xFFFF5302


class Prio3(Prio3Rows):
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
