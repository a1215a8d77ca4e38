"""The Mastic VDAF, draft-mouris-cfrg-mastic-04 (2025-01-21), on
draft-irtf-cfrg-vdaf-13's FLP and XOFs — the version whose published test
vectors (tests/vectors/mastic/04/) this module reproduces byte for byte.

A report is a VIDPF key pair (vdaf/vidpf.py) for an input string α of BITS
bits with the payload β = (1, encoded weight), plus a proof (vdaf/flp13.py)
that the weight is valid.  For one aggregation parameter (a tree level, the
candidate prefixes of that level, whether to check the weight) each
aggregator evaluates its key on the prefixes and their siblings and sends one
*evaluation proof*: a hash over

- the *onehot check*: the node proofs of every node it visited (for honest
  keys both aggregators compute the same proofs; off α's path the two trees
  are equal, on it the correction word makes them so);
- the *counter check*: its share of β's first element, which must be 1
  (aggregator 1 negates its share and adds 1 so that both hash the same value);
- the *payload check*: at every visited inner node, the node's payload minus
  its two children's (zero on the sum for a tree whose payloads add up);

keyed with the verify key, so equal hashes mean the report is one-hot with a
counter of one.  With the weight check on, each aggregator also queries the
FLP on its share of β's weight (the sum of the first level's two payloads).

Why draft 04 and draft-13 under it: it is the newest version of the draft,
its reference code and vectors pin VDAF draft 13 (XofTurboShake128 with the
draft-13 framing, XofFixedKeyAes128 for the VIDPF), and nothing later has
vectors.  The Prio3 path of `vdaf/` stays draft 07; the two share only the
fields.  Scalar Python throughout; the servers' sparse path batches the VIDPF
evaluation over the whole domain (see docs/vdaf.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from svtagg.vdaf.field import FIELD64, FIELD128, Field
from svtagg.vdaf.flp13 import (
    Circuit,
    Count,
    Flp,
    Histogram,
    MultihotCountVec,
    Sum,
    SumVec,
)
from svtagg.vdaf.sparse import SparseError, pack_ctrl, unpack_ctrl
from svtagg.vdaf.turboshake import XofTurboShake128, next_vec
from svtagg.vdaf.vidpf import (
    PROOF_SIZE,
    VERSION,
    CorrectionWord,
    Node,
    Vidpf,
    encode_path,
)

# Usages of the draft's `dst_alg` (the VIDPF's own are 9–11, vdaf/vidpf.py).
USAGE_PROVE_RAND = 0
USAGE_PROOF_SHARE = 1
USAGE_QUERY_RAND = 2
USAGE_JOINT_RAND_SEED = 3
USAGE_JOINT_RAND_PART = 4
USAGE_JOINT_RAND = 5
USAGE_ONEHOT_CHECK = 6
USAGE_PAYLOAD_CHECK = 7
USAGE_EVAL_PROOF = 8

SEED_SIZE = XofTurboShake128.SEED_SIZE
VERIFY_KEY_SIZE = SEED_SIZE
NONCE_SIZE = 16


class MasticError(ValueError):
    """A report or message that does not verify or does not parse."""


@dataclass(frozen=True)
class AggParam:
    """One aggregation: the tree level (0-based), that level's candidate
    prefixes (each level + 1 bits long), whether to check the weight."""

    level: int
    prefixes: tuple[tuple[bool, ...], ...]
    weight_check: bool

    def encode(self) -> bytes:
        if not 0 <= self.level < 1 << 16:
            raise MasticError("level out of range")
        out = self.level.to_bytes(2, "big") + len(self.prefixes).to_bytes(4, "big")
        out += b"".join(encode_path(x) for x in self.prefixes)
        return out + bytes([int(self.weight_check)])


@dataclass(frozen=True)
class InputShare:
    """One aggregator's part of a report: its VIDPF key, the leader's proof
    share (the helper's is expanded from its seed), the seed that derives
    the helper's proof share or the aggregator's joint-randomness part, and
    the peer's joint-randomness part (circuits with joint randomness only)."""

    key: bytes
    proof_share: list[int] | None
    seed: bytes | None
    peer_part: bytes | None


@dataclass(frozen=True)
class PrepShare:
    eval_proof: bytes
    verifier: list[int] | None
    jr_part: bytes | None


@dataclass(frozen=True)
class PrepState:
    out_share: list[int]
    jr_seed: bytes | None


class Mastic:
    """Mastic over `circuit` (its field) for BITS-bit inputs; `alg_id` is the
    draft's algorithm id of the instance."""

    SHARES = 2

    def __init__(self, bits: int, circuit: Circuit, alg_id: int) -> None:
        self.bits = bits
        self.circuit = circuit
        self.field: Field = circuit.field
        self.flp = Flp(circuit)
        self.vidpf = Vidpf(self.field, bits, 1 + circuit.meas_len)
        self.alg_id = alg_id
        self.uses_jr = circuit.joint_rand_len > 0
        self.rand_size = 2 * 16 + 2 * SEED_SIZE + (SEED_SIZE if self.uses_jr else 0)

    # ------------------------------------------------------------ XOF helpers
    def dst(self, ctx: bytes, usage: int) -> bytes:
        return b"mastic" + bytes([VERSION, usage]) + self.alg_id.to_bytes(4, "big") + ctx

    def _vec(self, seed: bytes, ctx: bytes, usage: int, binder: bytes, n: int) -> list[int]:
        xof = XofTurboShake128(seed, self.dst(ctx, usage), binder)
        return next_vec(xof, self.field.modulus, self.field.encoded_size, n)

    def helper_proof_share(self, ctx: bytes, seed: bytes) -> list[int]:
        return self._vec(seed, ctx, USAGE_PROOF_SHARE, b"", self.circuit.proof_len)

    def jr_part(self, ctx: bytes, seed: bytes, weight_share: Sequence[int], nonce: bytes) -> bytes:
        dst = self.dst(ctx, USAGE_JOINT_RAND_PART)
        return XofTurboShake128.derive_seed(seed, dst, nonce + self.field.encode_vec(weight_share))

    def jr_seed(self, ctx: bytes, parts: Sequence[bytes]) -> bytes:
        return XofTurboShake128.derive_seed(
            b"", self.dst(ctx, USAGE_JOINT_RAND_SEED), b"".join(parts)
        )

    def joint_rand(self, ctx: bytes, seed: bytes) -> list[int]:
        return self._vec(seed, ctx, USAGE_JOINT_RAND, b"", self.circuit.joint_rand_len)

    def query_rand(self, verify_key: bytes, ctx: bytes, nonce: bytes, level: int) -> list[int]:
        binder = nonce + level.to_bytes(2, "little")
        return self._vec(verify_key, ctx, USAGE_QUERY_RAND, binder, self.circuit.query_rand_len)

    # ------------------------------------------------------------ the client
    def shard(
        self, ctx: bytes, alpha: Sequence[bool], weight: object, nonce: bytes, rand: bytes
    ) -> tuple[list[CorrectionWord], tuple[InputShare, InputShare]]:
        """The public share (the correction words) and the two input shares.
        `rand`: `rand_size` bytes from a CSPRNG."""
        if len(rand) != self.rand_size or len(nonce) != NONCE_SIZE:
            raise MasticError(f"a nonce of {NONCE_SIZE} bytes and {self.rand_size} random bytes")
        p = self.field.modulus
        vidpf_rand, rand = rand[:32], rand[32:]
        prove_seed, helper_seed = rand[:SEED_SIZE], rand[SEED_SIZE : 2 * SEED_SIZE]
        leader_seed = rand[2 * SEED_SIZE :] if self.uses_jr else None
        encoded = self.circuit.encode(weight)
        words, keys = self.vidpf.gen(tuple(alpha), [1, *encoded], ctx, nonce, vidpf_rand)
        joint_rand: list[int] = []
        parts: list[bytes | None] = [None, None]
        if leader_seed is not None:
            shares = [self.vidpf.beta_share(i, words, keys[i], ctx, nonce) for i in (0, 1)]
            seeds = (leader_seed, helper_seed)
            parts = [self.jr_part(ctx, seeds[i], shares[i][1:], nonce) for i in (0, 1)]
            joint_rand = self.joint_rand(ctx, self.jr_seed(ctx, parts))  # type: ignore[arg-type]
        prove_rand = self._vec(prove_seed, ctx, USAGE_PROVE_RAND, b"", self.circuit.prove_rand_len)
        proof = self.flp.prove(encoded, prove_rand, joint_rand)
        helper_share = self.helper_proof_share(ctx, helper_seed)
        leader_share = [(a - b) % p for a, b in zip(proof, helper_share, strict=True)]
        return words, (
            InputShare(keys[0], leader_share, leader_seed, parts[1]),
            InputShare(keys[1], None, helper_seed, parts[0]),
        )

    # ------------------------------------------------------------ the aggregators
    def prep_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg: AggParam,
        nonce: bytes,
        words: Sequence[CorrectionWord],
        share: InputShare,
    ) -> tuple[PrepState, PrepShare]:
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise MasticError(f"the verify key is {VERIFY_KEY_SIZE} bytes")
        if any(len(x) != agg.level + 1 for x in agg.prefixes) or not 0 <= agg.level < self.bits:
            raise MasticError("prefixes of another level, or a level past the input's bits")
        out, root = self.vidpf.eval_prefixes(agg_id, words, share.key, agg.prefixes, ctx, nonce)
        verifier = jr_part = jr_seed = None
        if agg.weight_check:
            proof_share = share.proof_share
            if agg_id == 1:
                if share.seed is None:
                    raise MasticError("the helper's input share has no seed")
                proof_share = self.helper_proof_share(ctx, share.seed)
            if proof_share is None:
                raise MasticError("the leader's input share has no proof share")
            beta = self.vidpf.beta_share(agg_id, words, share.key, ctx, nonce)
            joint_rand: list[int] = []
            if self.uses_jr:
                if share.seed is None or share.peer_part is None:
                    raise MasticError("an input share without its joint-randomness parts")
                jr_part = self.jr_part(ctx, share.seed, beta[1:], nonce)
                parts = [jr_part, share.peer_part] if agg_id == 0 else [share.peer_part, jr_part]
                jr_seed = self.jr_seed(ctx, parts)
                joint_rand = self.joint_rand(ctx, jr_seed)
            query_rand = self.query_rand(verify_key, ctx, nonce, agg.level)
            verifier = self.flp.query(beta[1:], proof_share, query_rand, joint_rand, 2)
        eval_proof = self.eval_proof(verify_key, ctx, agg_id, root)
        truncated: list[int] = []
        for v in out:
            truncated += [v[0], *self.circuit.truncate(v[1:])]
        return PrepState(truncated, jr_seed), PrepShare(eval_proof, verifier, jr_part)

    def eval_proof(self, verify_key: bytes, ctx: bytes, agg_id: int, root: Node) -> bytes:
        """The hash of the onehot, counter and payload checks over the tree
        this aggregator walked (breadth first from the root's children)."""
        p = self.field.modulus
        payload, onehot = bytearray(), bytearray()
        queue = [root.children[False], root.children[True]]
        while queue:
            n = queue.pop(0)
            kids = n.children
            if False in kids and True in kids:
                left, right = kids[False].w, kids[True].w
                payload += self.field.encode_vec(
                    [(a - b - c) % p for a, b, c in zip(n.w, left, right, strict=True)]
                )
                queue += [kids[False], kids[True]]
            onehot += n.proof
        payload_check = XofTurboShake128(
            b"", self.dst(ctx, USAGE_PAYLOAD_CHECK), bytes(payload)
        ).next(PROOF_SIZE)
        onehot_check = XofTurboShake128(b"", self.dst(ctx, USAGE_ONEHOT_CHECK), bytes(onehot)).next(
            PROOF_SIZE
        )
        counter = (root.children[False].w[0] + root.children[True].w[0] + agg_id) % p
        return XofTurboShake128(
            verify_key,
            self.dst(ctx, USAGE_EVAL_PROOF),
            onehot_check + self.field.encode_vec([counter]) + payload_check,
        ).next(PROOF_SIZE)

    def prep_shares_to_prep(
        self, ctx: bytes, agg: AggParam, shares: Sequence[PrepShare]
    ) -> bytes | None:
        """The prep message (the joint-randomness seed, or None); raises
        MasticError when the report does not verify."""
        if len(shares) != 2:
            raise MasticError("two prep shares are needed")
        a, b = shares
        if a.eval_proof != b.eval_proof:
            raise MasticError("VIDPF verification failed (the evaluation proofs differ)")
        if not agg.weight_check:
            return None
        if a.verifier is None or b.verifier is None:
            raise MasticError("the weight check needs both verifier shares")
        p = self.field.modulus
        verifier = [(x + y) % p for x, y in zip(a.verifier, b.verifier, strict=True)]
        if not self.flp.decide(verifier):
            raise MasticError("FLP verification failed (the weight is not valid)")
        if not self.uses_jr:
            return None
        if a.jr_part is None or b.jr_part is None:
            raise MasticError("the joint-randomness parts are missing")
        return self.jr_seed(ctx, [a.jr_part, b.jr_part])

    def prep_next(self, state: PrepState, msg: bytes | None) -> list[int]:
        if state.jr_seed is not None and msg != state.jr_seed:
            raise MasticError("the joint randomness does not match the client's")
        return state.out_share

    def aggregate(self, agg: AggParam, out_shares: Sequence[Sequence[int]]) -> list[int]:
        p = self.field.modulus
        acc = [0] * (len(agg.prefixes) * (1 + self.circuit.output_len))
        for share in out_shares:
            acc = [(x + y) % p for x, y in zip(acc, share, strict=True)]
        return acc

    def unshard(self, agg: AggParam, agg_shares: Sequence[Sequence[int]]) -> list[object]:
        total = self.aggregate(agg, agg_shares)
        step = 1 + self.circuit.output_len
        return [
            self.circuit.decode(total[i + 1 : i + step], total[i])
            for i in range(0, len(total), step)
        ]

    # ------------------------------------------------------------ encodings
    def encode_public_share(self, words: Sequence[CorrectionWord]) -> bytes:
        return (
            pack_ctrl([w.ctrl for w in words])
            + b"".join(w.seed for w in words)
            + b"".join(self.field.encode_vec(w.payload) for w in words)
            + b"".join(w.proof for w in words)
        )

    def decode_public_share(self, data: bytes) -> list[CorrectionWord]:
        n, size = self.bits, self.field.encoded_size
        value_len = self.vidpf.value_len
        want = (2 * n + 7) // 8 + n * (16 + value_len * size + PROOF_SIZE)
        if len(data) != want:
            raise MasticError(f"a public share is {want} bytes, not {len(data)}")
        try:
            ctrl, at = unpack_ctrl(data, n, want)
        except SparseError as exc:
            raise MasticError(str(exc)) from None
        seeds = [data[at + 16 * i : at + 16 * (i + 1)] for i in range(n)]
        at += 16 * n
        payloads = []
        for _ in range(n):
            row = [
                int.from_bytes(data[at + size * j : at + size * (j + 1)], "little")
                for j in range(value_len)
            ]
            if any(x >= self.field.modulus for x in row):
                raise MasticError("a payload element is not below the modulus")
            payloads.append(tuple(row))
            at += size * value_len
        proofs = [data[at + PROOF_SIZE * i : at + PROOF_SIZE * (i + 1)] for i in range(n)]
        return [CorrectionWord(seeds[i], ctrl[i], payloads[i], proofs[i]) for i in range(n)]

    def encode_input_share(self, share: InputShare) -> bytes:
        out = share.key
        if share.proof_share is not None:
            out += self.field.encode_vec(share.proof_share)
        return out + (share.seed or b"") + (share.peer_part or b"")

    def encode_prep_share(self, share: PrepShare) -> bytes:
        out = share.eval_proof + (share.jr_part or b"")
        return out + (self.field.encode_vec(share.verifier) if share.verifier is not None else b"")

    def encode_agg_share(self, share: Sequence[int]) -> bytes:
        return self.field.encode_vec(share)


def mastic_count(bits: int) -> Mastic:
    return Mastic(bits, Count(FIELD64), 0xFFFF0001)


def mastic_sum(bits: int, max_measurement: int) -> Mastic:
    return Mastic(bits, Sum(FIELD64, max_measurement), 0xFFFF0002)


def mastic_sum_vec(bits: int, length: int, sum_vec_bits: int, chunk_length: int) -> Mastic:
    return Mastic(bits, SumVec(FIELD128, length, sum_vec_bits, chunk_length), 0xFFFF0003)


def mastic_histogram(bits: int, length: int, chunk_length: int) -> Mastic:
    return Mastic(bits, Histogram(FIELD128, length, chunk_length), 0xFFFF0004)


def mastic_multihot(bits: int, length: int, max_weight: int, chunk_length: int) -> Mastic:
    return Mastic(bits, MultihotCountVec(FIELD128, length, max_weight, chunk_length), 0xFFFF0005)
