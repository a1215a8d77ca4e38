"""Prio3 over a batch of reports at once (draft-irtf-cfrg-vdaf-07 §7.2): the
client sharding many measurements, an aggregator preparing an upload batch.

Every report of a batch is a row of a few matrices: the nonces, the public
shares' joint randomness parts, the seeds and blinds (bytes, `numpy.uint8`),
the Leader's measurement and proof shares (field vectors).  Each XOF usage is
one call over all rows (`xof.expand_rows_into`, `xof.derive_seed_rows`: the
native core runs several SHAKE128 streams per Keccak permutation), the
circuit and the FLP run over the matrices (`FlpGeneric.prove_batch`,
`query_batch`), and the messages are encoded and decoded a batch at a time.
Row i of every result is byte for byte what the per-report algorithm of
vdaf/prio3.py gives report i (tests/test_vdaf_batch.py, test_vdaf_rows.py).

`Prio3Rows` is mixed into `Prio3`; besides the matrix forms
(`shard_rows`, `prep_init_rows`, `prep_shares_to_prep_rows`,
`prep_next_rows` and the codecs) it keeps the per-report-object forms
`shard_batch`, `prep_init_batch` and `prep_shares_to_prep_batch`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from svtagg.vdaf import native as _backend
from svtagg.vdaf.field import DecodeError, Field, Vec
from svtagg.vdaf.flp import FlpGeneric
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
from svtagg.vdaf.xof import (
    SEED_SIZE,
    Piece,
    derive_seed_rows,
    expand_rows_into,
    format_dst,
    per_row,
    shared,
)

#: Bytes, one row per report.
U8 = npt.NDArray[np.uint8]
#: Reports per internal step of the preparation's FLP: big enough that per-call
#: overhead is spread thin, small enough that a step's matrices stay in cache.
_PREP_BATCH = 256
#: The same for sharding, whose wire matrices (arity × reports × 2P elements)
#: are the largest; 32–256 measured within noise of each other.
_SHARD_BATCH = 64


@dataclass(frozen=True)
class ReportRows:
    """One aggregator's input of a batch: per row a report's nonce, the joint
    randomness parts of its public share, and this aggregator's input share —
    the Leader's vectors, or a Helper's seeds (measurement seed, then proof seed)."""

    nonces: U8  # (rows, NONCE_SIZE)
    publics: U8 | None = None  # (rows, SEED_SIZE · shares), with joint randomness
    meas: Vec | None = None  # the Leader's (rows, meas_len)
    proof: Vec | None = None  # the Leader's (rows, proof_len)
    seeds: U8 | None = None  # a Helper's (rows, 2 · SEED_SIZE)
    blinds: U8 | None = None  # (rows, SEED_SIZE), with joint randomness

    @property
    def rows(self) -> int:
        return int(self.nonces.shape[0])


@dataclass(frozen=True)
class PrepRows:
    """prep_init of a batch: per row the prep share (verifier, joint randomness
    part) and the prep state (output share, corrected joint randomness seed)."""

    verifiers: Vec  # (rows, verifier_len)
    parts: U8 | None  # (rows, SEED_SIZE)
    out_shares: Vec  # (rows, output_len)
    seeds: U8 | None  # (rows, SEED_SIZE)


@dataclass(frozen=True)
class ShardRows:
    """shard of a batch: per row the public share's parts, the Leader's vectors
    and the report's randomness (the Helpers' seeds and every blind are cut
    from it, in the draft's order)."""

    publics: U8 | None  # (rows, SEED_SIZE · shares)
    meas: Vec  # the Leader's (rows, meas_len)
    proof: Vec  # the Leader's (rows, proof_len)
    rands: U8  # (rows, rand_size)


def _matrix(blobs: Sequence[bytes], width: int) -> U8:
    """Equal-length byte strings as the rows of a matrix."""
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), width)


def _decode_rows(
    f: Field, blobs: Sequence[bytes], offset: int, length: int
) -> tuple[Vec, list[int]]:
    """The field vectors of `length` elements encoded at `offset` in each blob,
    as rows, and the rows holding an element ≥ p (zeros in the result).
    Natively one copy into the matrix and a check in place."""
    size, rows = f.encoded_size, len(blobs)
    width = length * size
    if f._native():
        out = np.empty((rows, length), dtype=f._dtype())
        core = _backend.core()
        core.copy_rows(blobs, offset, width, out)
        if core.sample(f.fid, out, out) == out.size:
            return out, []
    else:
        try:
            data = b"".join(b[offset : offset + width] for b in blobs)
            return f.decode_vec(data).reshape(rows, length), []
        except DecodeError:
            pass
    bad, good = [], []
    for i, blob in enumerate(blobs):
        try:
            good.append(f.decode_vec(blob[offset : offset + width]))
        except DecodeError:
            bad.append(i)
            good.append(f.zeros(length))
    return np.stack(good).reshape(rows, length), bad


class Prio3Rows:
    """The batched algorithms of Prio3 (mixed into `vdaf.prio3.Prio3`)."""

    field: Field
    flp: FlpGeneric
    algorithm_id: int
    shares: int
    uses_joint_rand: bool
    rand_size: int

    def _dst(self, usage: int) -> bytes:
        return format_dst(0, self.algorithm_id, usage)

    def _expand_rows(
        self, usage: int, seed: Piece, binder: Sequence[Piece], rows: int, length: int
    ) -> Vec:
        return expand_rows_into(self.field, seed, self._dst(usage), binder, rows, length)

    def _bytes_piece(self, vecs: Vec) -> Piece:
        """The rows of a matrix of field vectors as a piece of XOF input (their encoding)."""
        width = vecs.shape[1] * self.field.encoded_size
        if vecs.dtype == object:
            return per_row(self.field.encode_vec(vecs), width)
        return per_row(np.ascontiguousarray(vecs), width)

    def _parts_rows(self, agg_id: int, blinds: Piece, nonces: U8, meas: Vec) -> U8:
        """Each row's joint randomness part of aggregator `agg_id` (`joint_rand_part`)."""
        binder = [shared(bytes([agg_id])), per_row(nonces, NONCE_SIZE), self._bytes_piece(meas)]
        dst = self._dst(USAGE_JOINT_RAND_PART)
        return derive_seed_rows(blinds, dst, binder, meas.shape[0])

    def _seeds_rows(self, parts: U8) -> U8:
        """Each row's joint randomness seed from all its parts (`joint_rand_seed`)."""
        dst = self._dst(USAGE_JOINT_RAND_SEED)
        width = SEED_SIZE * self.shares
        return derive_seed_rows(shared(bytes(SEED_SIZE)), dst, [per_row(parts, width)], len(parts))

    def _encode_batch(self, measurements: Sequence[object]) -> Vec:
        encode_batch = getattr(self.flp.valid, "encode_batch", None)
        if encode_batch is not None:
            return encode_batch(measurements)  # type: ignore[no-any-return]
        meas = np.stack([self.flp.encode(m) for m in measurements])
        return meas.reshape(len(measurements), self.flp.meas_len)

    def _truncate_rows(self, meas: Vec) -> Vec:
        truncate_batch = getattr(self.flp.valid, "truncate_batch", None)
        if truncate_batch is not None:
            return truncate_batch(meas)  # type: ignore[no-any-return]
        return np.stack([self.flp.truncate(m) for m in meas]).reshape(meas.shape[0], -1)

    # -- sharding (Client; draft §7.2.1) ---------------------------------------------
    def shard_rows(self, meas: Vec, nonces: U8, rands: U8) -> ShardRows:
        """`shard_encoded` of each row of an encoded measurement matrix, with the
        row's nonce and randomness."""
        f, flp, rows = self.field, self.flp, meas.shape[0]
        helpers, size = self.shares - 1, self.rand_size
        per_helper = 3 if self.uses_joint_rand else 2

        def seed(k: int) -> Piece:  # seed k (of 16 bytes) of each row's randomness
            return per_row(rands, SEED_SIZE, SEED_SIZE * k, size)

        leader_meas = meas
        publics = np.empty((rows, SEED_SIZE * self.shares), dtype=np.uint8)
        for j in range(1, helpers + 1):
            share = self._expand_rows(
                USAGE_MEAS_SHARE,
                seed(per_helper * (j - 1)),
                [shared(bytes([j]))],
                rows,
                flp.meas_len,
            )
            leader_meas = f.sub(leader_meas, share)
            if self.uses_joint_rand:
                part = self._parts_rows(j, seed(per_helper * (j - 1) + 2), nonces, share)
                publics[:, SEED_SIZE * j : SEED_SIZE * (j + 1)] = part
        joint_rand = f.zeros_as(meas, rows, 0)
        if self.uses_joint_rand:
            publics[:, :SEED_SIZE] = self._parts_rows(
                0, seed(per_helper * helpers), nonces, leader_meas
            )
            joint_rand = self._expand_rows(
                USAGE_JOINT_RANDOMNESS,
                per_row(self._seeds_rows(publics), SEED_SIZE),
                [],
                rows,
                flp.joint_rand_len,
            )
        last = size // SEED_SIZE - 1
        prove_rand = self._expand_rows(
            USAGE_PROVE_RANDOMNESS, seed(last), [], rows, flp.prove_rand_len
        )
        proof = flp.prove_batch(meas, prove_rand, joint_rand)
        for j in range(1, helpers + 1):
            helper_proof = self._expand_rows(
                USAGE_PROOF_SHARE,
                seed(per_helper * (j - 1) + 1),
                [shared(bytes([j]))],
                rows,
                flp.proof_len,
            )
            proof = f.sub(proof, helper_proof)
        return ShardRows(publics if self.uses_joint_rand else None, leader_meas, proof, rands)

    def shard_encode_rows(self, sharded: ShardRows) -> list[tuple[bytes, list[bytes]]]:
        """Each row's (encoded public share, encoded input shares), as
        `encode_public_share` and `encode_input_share` give them."""
        f, rows = self.field, sharded.rands.shape[0]
        helpers, size = self.shares - 1, self.rand_size
        per_helper = 3 if self.uses_joint_rand else 2
        pieces = [
            np.frombuffer(f.encode_vec(sharded.meas), dtype=np.uint8).reshape(rows, -1),
            np.frombuffer(f.encode_vec(sharded.proof), dtype=np.uint8).reshape(rows, -1),
        ]
        if self.uses_joint_rand:  # the Leader's blind follows the Helpers' seeds
            start = SEED_SIZE * per_helper * helpers
            pieces.append(sharded.rands[:, start : start + SEED_SIZE])
        leader = np.concatenate(pieces, axis=1).tobytes()
        rands = sharded.rands.tobytes()
        publics = b"" if sharded.publics is None else sharded.publics.tobytes()
        lw, pw, hw = len(leader) // max(rows, 1), SEED_SIZE * self.shares, SEED_SIZE * per_helper
        out = []
        for i in range(rows):
            public = publics[i * pw : (i + 1) * pw]
            inputs = [leader[i * lw : (i + 1) * lw]]
            base = i * size
            inputs += [rands[base + j * hw : base + (j + 1) * hw] for j in range(helpers)]
            out.append((public, inputs))
        return out

    def _shard_checked(
        self,
        measurements: Sequence[object],
        nonces: Sequence[bytes],
        rands: Sequence[bytes] | None,
    ) -> tuple[U8, U8]:
        rows = len(measurements)
        if len(nonces) != rows or (rands is not None and len(rands) != rows):
            raise ValueError("one nonce (and rand, if given) per measurement")
        if any(len(n) != NONCE_SIZE for n in nonces):
            raise ValueError(f"the nonce is {NONCE_SIZE} bytes")
        rand_list = [os.urandom(self.rand_size) for _ in range(rows)] if rands is None else rands
        if any(len(r) != self.rand_size for r in rand_list):
            raise ValueError(f"sharding takes {self.rand_size} random bytes per report")
        return _matrix(nonces, NONCE_SIZE), _matrix(rand_list, self.rand_size)

    def shard_batch_encoded(
        self,
        measurements: Sequence[object],
        nonces: Sequence[bytes],
        rands: Sequence[bytes] | None = None,
    ) -> list[tuple[bytes, list[bytes]]]:
        """`shard_batch` with every share encoded: entry i is (encoded public share,
        encoded input shares) of shard(measurements[i], nonces[i], rands[i])."""
        nonce_m, rand_m = self._shard_checked(measurements, nonces, rands)
        out: list[tuple[bytes, list[bytes]]] = []
        for start in range(0, len(measurements), _SHARD_BATCH):
            end = min(len(measurements), start + _SHARD_BATCH)
            meas = self._encode_batch(measurements[start:end])
            sharded = self.shard_rows(meas, nonce_m[start:end], rand_m[start:end])
            out.extend(self.shard_encode_rows(sharded))
        return out

    def shard_batch(
        self,
        measurements: Sequence[object],
        nonces: Sequence[bytes],
        rands: Sequence[bytes] | None = None,
    ) -> list[tuple[list[bytes] | None, list[InputShare]]]:
        """`shard` for many measurements (a client uploading many rows): entry i is
        shard(measurements[i], nonces[i], rands[i]) byte for byte.  Each `rands`
        entry defaults to fresh CSPRNG bytes; fixed values are for tests only."""
        nonce_m, rand_m = self._shard_checked(measurements, nonces, rands)
        per_helper = 3 if self.uses_joint_rand else 2
        out: list[tuple[list[bytes] | None, list[InputShare]]] = []
        for start in range(0, len(measurements), _SHARD_BATCH):
            end = min(len(measurements), start + _SHARD_BATCH)
            meas = self._encode_batch(measurements[start:end])
            sharded = self.shard_rows(meas, nonce_m[start:end], rand_m[start:end])
            for i in range(end - start):
                seeds = [
                    sharded.rands[i, k : k + SEED_SIZE].tobytes()
                    for k in range(0, self.rand_size, SEED_SIZE)
                ]
                public = None
                if sharded.publics is not None:
                    parts = sharded.publics[i].tobytes()
                    public = [parts[k : k + SEED_SIZE] for k in range(0, len(parts), SEED_SIZE)]
                blind = seeds[per_helper * (self.shares - 1)] if self.uses_joint_rand else None
                inputs = [InputShare(meas=sharded.meas[i], proof=sharded.proof[i], blind=blind)]
                for j in range(self.shares - 1):
                    hs = seeds[per_helper * j : per_helper * (j + 1)]
                    h_blind = hs[2] if self.uses_joint_rand else None
                    inputs.append(InputShare(meas_seed=hs[0], proof_seed=hs[1], blind=h_blind))
                out.append((public, inputs))
        return out

    # -- preparation (each Aggregator; draft §7.2.2) ---------------------------------
    def prep_init_rows(self, verify_key: bytes, agg_id: int, reports: ReportRows) -> PrepRows:
        """`prep_init` of every row: this aggregator's prep shares and prep states."""
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise ValueError(f"the verify key is {VERIFY_KEY_SIZE} bytes")
        if not 0 <= agg_id < self.shares:
            raise ValueError(f"aggregator id {agg_id} out of range")
        f, flp, rows = self.field, self.flp, reports.rows
        self._check_rows(agg_id, reports)
        given = reports.meas if agg_id == 0 else None
        # a Helper expands its shares into a matrix of its own
        meas_all: Vec = f.empty(rows, flp.meas_len) if given is None else given
        verifiers = f.zeros_as(meas_all, rows, flp.verifier_len)
        parts = np.empty((rows, SEED_SIZE), dtype=np.uint8) if self.uses_joint_rand else None
        seeds = np.empty((rows, SEED_SIZE), dtype=np.uint8) if self.uses_joint_rand else None
        for start in range(0, rows, _PREP_BATCH):
            end = min(rows, start + _PREP_BATCH)
            n, nonces = end - start, reports.nonces[start:end]
            if agg_id == 0:
                meas, proof = meas_all[start:end], reports.proof[start:end]  # type: ignore[index]
            else:
                helper = np.ascontiguousarray(reports.seeds[start:end])  # type: ignore[index]
                binder = [shared(bytes([agg_id]))]
                meas = expand_rows_into(
                    f,
                    per_row(helper, SEED_SIZE, 0, 32),
                    self._dst(USAGE_MEAS_SHARE),
                    binder,
                    n,
                    flp.meas_len,
                    meas_all[start:end],
                )
                proof = self._expand_rows(
                    USAGE_PROOF_SHARE, per_row(helper, SEED_SIZE, 16, 32), binder, n, flp.proof_len
                )
            joint_rand = f.zeros_as(meas, n, 0)
            if parts is not None and seeds is not None:
                blinds = per_row(reports.blinds[start:end], SEED_SIZE)  # type: ignore[index]
                parts[start:end] = self._parts_rows(agg_id, blinds, nonces, meas)
                corrected = reports.publics[start:end].copy()  # type: ignore[index]
                corrected[:, SEED_SIZE * agg_id : SEED_SIZE * (agg_id + 1)] = parts[start:end]
                seeds[start:end] = self._seeds_rows(corrected)
                joint_rand = self._expand_rows(
                    USAGE_JOINT_RANDOMNESS,
                    per_row(seeds[start:end], SEED_SIZE),
                    [],
                    n,
                    flp.joint_rand_len,
                )
            query_rand = self._expand_rows(
                USAGE_QUERY_RANDOMNESS,
                shared(verify_key),
                [per_row(nonces, NONCE_SIZE)],
                n,
                flp.query_rand_len,
            )
            verifiers[start:end] = flp.query_batch(meas, proof, query_rand, joint_rand, self.shares)
        return PrepRows(verifiers, parts, self._truncate_rows(meas_all), seeds)

    def _check_rows(self, agg_id: int, reports: ReportRows) -> None:
        """Refuse (ValueError) matrices of the wrong shape for this instance."""
        rows, flp = reports.rows, self.flp
        want: dict[str, tuple[Any, int]] = {"nonces": (reports.nonces, NONCE_SIZE)}
        if agg_id == 0:
            want |= {"meas": (reports.meas, flp.meas_len), "proof": (reports.proof, flp.proof_len)}
        else:
            want["seeds"] = (reports.seeds, 2 * SEED_SIZE)
        if self.uses_joint_rand:
            want |= {
                "publics": (reports.publics, SEED_SIZE * self.shares),
                "blinds": (reports.blinds, SEED_SIZE),
            }
        for name, (arr, width) in want.items():
            if arr is None:
                raise ValueError(f"the reports lack their {name}")
            if arr.shape != (rows, width):
                raise ValueError(f"{name} of shape {arr.shape}, expected ({rows}, {width})")

    def prep_shares_to_prep_rows(
        self, verifiers: Sequence[Vec], parts: Sequence[U8 | None]
    ) -> tuple[npt.NDArray[np.bool_], U8 | None]:
        """`prep_shares_to_prep` of every row, from each aggregator's verifier
        shares and joint randomness parts: whether the proof is accepted, and
        the prep message (the joint randomness seed, or None for the instance)."""
        if len(verifiers) != self.shares or len(parts) != self.shares:
            raise ValueError(f"expected {self.shares} prep shares per report")
        f = self.field
        total = verifiers[0]
        for v in verifiers[1:]:
            total = f.add(total, v)
        accepted = self.flp.decide_batch(total)
        if not self.uses_joint_rand:
            return accepted, None
        if any(p is None for p in parts):
            raise ValueError("a prep share lacks its joint randomness part")
        return accepted, self._seeds_rows(np.concatenate(parts, axis=1))  # type: ignore[arg-type]

    def prep_next_rows(
        self,
        prep: PrepRows,
        msgs: U8 | None,
        rows: Sequence[int] | npt.NDArray[np.intp] | None = None,
    ) -> npt.NDArray[np.bool_]:
        """`prep_next` of every row of `prep` (or of the rows `rows`, msgs[k] for
        rows[k]): whether the prep message is the joint randomness seed the
        row's shares commit to (its output share is then `prep.out_shares[row]`)."""
        count = prep.verifiers.shape[0] if rows is None else len(rows)
        if msgs is None or prep.seeds is None:
            return np.full(count, msgs is None and prep.seeds is None)
        seeds = prep.seeds if rows is None else prep.seeds[np.asarray(rows, dtype=np.intp)]
        return np.all(msgs == seeds, axis=1)  # type: ignore[no-any-return]

    # -- message encodings of a batch (draft §7.2.6) ---------------------------------
    def decode_report_rows(
        self,
        agg_id: int,
        nonces: Sequence[bytes],
        publics: Sequence[bytes],
        shares: Sequence[bytes],
    ) -> tuple[list[int], ReportRows]:
        """The reports whose nonce, public share and input share (this aggregator's)
        decode — their indices, and them as rows; `decode_public_share` and
        `decode_input_share` would refuse the others."""
        f, flp = self.field, self.flp
        if not len(nonces) == len(publics) == len(shares):
            raise ValueError("one nonce, public share and input share per report")
        blind = SEED_SIZE if self.uses_joint_rand else 0
        public_len = SEED_SIZE * self.shares if self.uses_joint_rand else 0
        meas_bytes = flp.meas_len * f.encoded_size
        body = meas_bytes + flp.proof_len * f.encoded_size if agg_id == 0 else 2 * SEED_SIZE
        ok = [
            i
            for i in range(len(shares))
            if len(nonces[i]) == NONCE_SIZE
            and len(publics[i]) == public_len
            and len(shares[i]) == body + blind
        ]
        good = [shares[i] for i in ok]
        if agg_id == 0:
            data = _matrix([s[body:] for s in good], blind)  # the blinds
            meas, bad = _decode_rows(f, good, 0, flp.meas_len)
            proof, bad_proof = _decode_rows(f, good, meas_bytes, flp.proof_len)
            if bad or bad_proof:
                keep = sorted(set(range(len(ok))) - set(bad) - set(bad_proof))
                ok, data = [ok[k] for k in keep], data[keep]
                meas, proof = meas[keep], proof[keep]
            rows = ReportRows(_matrix([nonces[i] for i in ok], NONCE_SIZE), meas=meas, proof=proof)
            body = 0
        else:
            data = _matrix(good, body + blind)
            seeds = np.ascontiguousarray(data[:, :body])
            rows = ReportRows(_matrix([nonces[i] for i in ok], NONCE_SIZE), seeds=seeds)
        if self.uses_joint_rand:
            rows = ReportRows(
                rows.nonces,
                _matrix([publics[i] for i in ok], public_len),
                rows.meas,
                rows.proof,
                rows.seeds,
                np.ascontiguousarray(data[:, body:]),
            )
        return ok, rows

    def encode_prep_share_rows(self, prep: PrepRows) -> list[bytes]:
        """Each row's encoded prep share (`encode_prep_share`)."""
        rows = prep.verifiers.shape[0]
        data = np.frombuffer(self.field.encode_vec(prep.verifiers), dtype=np.uint8)
        data = data.reshape(rows, -1)
        if prep.parts is not None:
            data = np.concatenate([data, prep.parts], axis=1)
        flat, width = data.tobytes(), data.shape[1]
        return [flat[i * width : (i + 1) * width] for i in range(rows)]

    def decode_prep_share_rows(self, blobs: Sequence[bytes]) -> tuple[Vec, U8 | None]:
        """Encoded prep shares as (verifiers, joint randomness parts); ValueError
        (naming the share) for one of the wrong length or not a field vector."""
        f = self.field
        size = self.flp.verifier_len * f.encoded_size
        part = SEED_SIZE if self.uses_joint_rand else 0
        for i, blob in enumerate(blobs):
            if len(blob) != size + part:
                raise ValueError(f"prep share {i}: {size + part} bytes expected, got {len(blob)}")
        verifiers, bad = _decode_rows(f, blobs, 0, self.flp.verifier_len)
        if bad:
            raise DecodeError(f"prep share {bad[0]}: an element is not below the modulus")
        return verifiers, (_matrix([b[size:] for b in blobs], part) if part else None)

    # -- the per-report objects over rows --------------------------------------------
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
        input_shares[i]) returns, byte for byte.  A malformed input (a share of
        the wrong kind or a missing blind) raises ValueError naming the report; an
        invalid measurement is not detected here but by
        `prep_shares_to_prep_batch`, report by report."""
        rows = len(nonces)
        if not rows == len(public_shares) == len(input_shares):
            raise ValueError("one nonce, public share and input share per report")
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise ValueError(f"the verify key is {VERIFY_KEY_SIZE} bytes")
        if not 0 <= agg_id < self.shares:
            raise ValueError(f"aggregator id {agg_id} out of range")
        if any(len(n) != NONCE_SIZE for n in nonces):
            raise ValueError(f"a nonce is {NONCE_SIZE} bytes")
        if rows == 0:
            return []
        reports = self._report_rows(agg_id, nonces, public_shares, input_shares)
        prep = self.prep_init_rows(verify_key, agg_id, reports)
        parts = [None] * rows if prep.parts is None else [p.tobytes() for p in prep.parts]
        seeds = [None] * rows if prep.seeds is None else [s.tobytes() for s in prep.seeds]
        return [
            (PrepState(prep.out_shares[i], seeds[i]), PrepShare(prep.verifiers[i], parts[i]))
            for i in range(rows)
        ]

    def _report_rows(
        self,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[Sequence[bytes] | None],
        input_shares: Sequence[InputShare],
    ) -> ReportRows:
        """Per-report objects as rows, refusing (ValueError naming the report) a
        share of the wrong kind, a missing blind or a malformed public share."""
        flp, rows = self.flp, len(nonces)
        meas = proof = seeds = publics = blinds = None
        if agg_id == 0:
            for i, sh in enumerate(input_shares):
                if sh.meas is None or sh.proof is None:
                    raise ValueError(f"report {i}: the Leader's input share carries vectors")
            meas_rows = [sh.meas for sh in input_shares if sh.meas is not None]
            proof_rows = [sh.proof for sh in input_shares if sh.proof is not None]
            meas = np.stack(meas_rows).reshape(rows, flp.meas_len)
            proof = np.stack(proof_rows).reshape(rows, flp.proof_len)
        else:
            for i, sh in enumerate(input_shares):
                if sh.meas_seed is None or sh.proof_seed is None:
                    raise ValueError(f"report {i}: a Helper's input share carries seeds")
            seeds = _matrix([sh.meas_seed + sh.proof_seed for sh in input_shares], 2 * SEED_SIZE)  # type: ignore[operator]
        if self.uses_joint_rand:
            for i, (public, sh) in enumerate(zip(public_shares, input_shares, strict=True)):
                if (
                    public is None
                    or len(public) != self.shares
                    or any(len(p) != SEED_SIZE for p in public)
                ):
                    raise ValueError(
                        f"report {i}: the public share must hold one joint randomness part each"
                    )
                if sh.blind is None or len(sh.blind) != SEED_SIZE:
                    raise ValueError(f"report {i}: the input share lacks its blind")
            publics = _matrix([b"".join(p) for p in public_shares], SEED_SIZE * self.shares)  # type: ignore[arg-type]
            blinds = _matrix([sh.blind for sh in input_shares], SEED_SIZE)  # type: ignore[misc]
        return ReportRows(_matrix(nonces, NONCE_SIZE), publics, meas, proof, seeds, blinds)

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
        verifiers = [
            np.stack([ps[j].verifier for ps in prep_shares]).reshape(rows, -1)
            for j in range(self.shares)
        ]
        parts: list[U8 | None] = [None] * self.shares
        if self.uses_joint_rand:
            for j in range(self.shares):
                col = [ps[j].joint_rand_part for ps in prep_shares]
                if any(p is None or len(p) != SEED_SIZE for p in col):
                    raise ValueError("a prep share lacks its joint randomness part")
                parts[j] = _matrix(col, SEED_SIZE)  # type: ignore[arg-type]
        accepted, msgs = self.prep_shares_to_prep_rows(verifiers, parts)
        out: list[bytes | None | VerifyError] = []
        for i in range(rows):
            if not accepted[i]:
                out.append(VerifyError("the validity proof is rejected"))
            else:
                out.append(None if msgs is None else msgs[i].tobytes())
        return out
