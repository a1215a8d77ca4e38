"""Ingest of reports that prove their validity (Prio3, draft-irtf-cfrg-vdaf-07).

A task with a validity circuit (`TaskParams.validity`, svtagg.vdaf.validity)
takes Prio3 reports: the client shards each report's measurement into an input
share per server plus a public share, with a fully linear proof that the
measurement is valid, and uploads to the helper first, then to the leader.

- The helper keeps each report's small input share (three 16-byte seeds) and
  the public share as *pending* (`Store.add_pending`) — nothing is counted.
- The leader's Upload verifies the batch with the helper in one exchange
  (`verify_upload`): it computes its Prio3 prep share of every report, sends
  them (`VerifyBatch`); the helper computes its own, combines both into each
  report's verdict, folds the valid reports' output shares into its field
  sums and records their ids, the batch's verdicts and the refusals in one
  transaction (`helper_verify`), and answers with its prep shares; the leader
  combines them the same way, checks that both verdicts agree, and folds and
  records likewise.  The client's answer names the refusals by reason.
- Only ids are stored per report, plus the helper's 16-byte measurement seed,
  which lets the close take out a report the leader never recorded (the
  helper records first; a leader killed in between never answered the
  client, who sends the batch again — the helper then answers with the
  verdicts it recorded, `VerifyResult.replayed`).

Both servers decide alike from the same two prep shares (the draft's
prep_shares_to_prep and prep_next), so an acknowledged report is counted once
on each.  What a verdict byte means: `Verdict`.

The retry rule.  The helper records each batch's verdicts with a `binding`: a
digest of the leader's prep shares they were decided on.  A batch sent again
(same task, same ids) is answered from the record only if its leader prep
shares are the same; otherwise it is refused and nothing is counted.  A leader
prep share is a function of the leader's input share: its joint randomness
part is a hash of the leader's measurement share, and its verifier is a linear
function of the leader's input share whose coefficients (the query randomness)
come from the verify key, which clients do not hold.  So a retry whose leader
shares changed cannot have its unverified output shares folded.

Bounds.  Every share's length is the circuit's (`Validity.input_share_bytes`);
a batch holds at most `Validity.batch_limit` reports, so that what its
verification allocates is bounded before anything is decoded; a report whose
leader share did not decode costs the helper nothing (it is refused without
being expanded); verification runs off the event loop, at most
`VERIFY_SLOTS` batches at a time per server; the helper keeps at most the
task's room plus one batch of unverified reports (`pending_cap`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from svtagg.dp.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    PeerUnavailable,
    ResourceExhausted,
)
from svtagg.proto.terms import MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
from svtagg.servers.exchange.values import VerifyBatch, VerifyResult
from svtagg.servers.faults import crash_point
from svtagg.servers.ingest.validity import (
    EXPAND_THREADS,
    field_words_rows,
    kept_of,
    scaled_words,
    task_validity,
)
from svtagg.servers.store.rules import TaskState, Verified, batch_id
from svtagg.vdaf.crawl import CrawlReports, check_level
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.prio3 import Prio3
from svtagg.vdaf.rows import PrepRows
from svtagg.vdaf.sparse import PREP_SHARE_SIZE, SparseError
from svtagg.vdaf.validity import Validity
from svtagg.vdaf.xof import SEED_SIZE

if TYPE_CHECKING:
    from svtagg.servers.core import ServerCore
    from svtagg.servers.exchange.port import HelperPort


class Verdict(IntEnum):
    """A report's fate at ingest (one byte per report on the wire and on disk)."""

    VALID = 0
    #: The FLP verifier rejects the proof (the measurement is invalid, or the
    #: proof was made for other values or another report).
    INVALID_PROOF = 1
    #: The joint randomness the client proved with is not the one its shares
    #: commit to (a wrong joint-randomness part in the public share).
    JOINT_RANDOMNESS = 2
    #: The leader's input share or the public share does not decode.
    MALFORMED_LEADER = 3
    #: The helper's input share or the public share does not decode.
    MALFORMED_HELPER = 4


#: The reason each refusal is counted under (what clients and operators see).
REASONS = {
    Verdict.INVALID_PROOF: "invalid_proof",
    Verdict.JOINT_RANDOMNESS: "joint_randomness",
    Verdict.MALFORMED_LEADER: "malformed_share",
    Verdict.MALFORMED_HELPER: "malformed_share",
}


@dataclass(frozen=True)
class ProofReport:
    """One uploaded report of a task with a validity circuit, as one server gets it."""

    report_id: bytes
    input_share: bytes
    public_share: bytes


@dataclass(frozen=True)
class Accepted:
    """An upload batch's outcome at the leader: n afterwards, and the refusals."""

    accepted: int
    n: int
    rejected: dict[str, int]


def rejected_counts(verdicts: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in verdicts:
        if v != Verdict.VALID:
            reason = REASONS[Verdict(v)]
            out[reason] = out.get(reason, 0) + 1
    return out


@dataclass
class _Prepared:
    """One server's side of a batch: per report its row in `prep` (-1 where its
    input share or the public share did not decode) and its encoded prep share
    (b"" there)."""

    index: list[int]
    prep: PrepRows | None
    shares: tuple[bytes, ...]


@dataclass
class _Shares:
    """One server's prep shares of a batch: per report its row in `verifiers`
    and `parts` (-1 where it sent none)."""

    index: list[int]
    verifiers: Any
    parts: Any


def _prepare(
    prio: Prio3, key: bytes, agg_id: int, reports: Sequence[tuple[bytes, bytes, bytes]]
) -> _Prepared:
    """prep_init over the decodable reports of a batch; `reports`: (nonce,
    public share, input share) bytes."""
    ok, rows = prio.decode_report_rows(
        agg_id, [r[0] for r in reports], [r[1] for r in reports], [r[2] for r in reports]
    )
    index = [-1] * len(reports)
    if not ok:
        return _Prepared(index, None, (b"",) * len(reports))
    prep = prio.prep_init_rows(key, agg_id, rows)
    encoded = prio.encode_prep_share_rows(prep)
    shares = [b""] * len(reports)
    for row, i in enumerate(ok):
        index[i], shares[i] = row, encoded[row]
    return _Prepared(index, prep, tuple(shares))


def _own(mine: _Prepared) -> _Shares:
    """This server's own prep shares, as the other's are decoded."""
    if mine.prep is None:
        return _Shares(mine.index, None, None)
    return _Shares(mine.index, mine.prep.verifiers, mine.prep.parts)


def _decide(
    prio: Prio3, mine: _Prepared, leader: _Shares, helper: _Shares
) -> tuple[bytes, list[int]]:
    """Each report's verdict from the two prep shares, and the valid reports'
    rows of this server's output shares, in batch order."""
    lidx, hidx = np.asarray(leader.index), np.asarray(helper.index)
    verdicts = np.full(len(lidx), Verdict.VALID, dtype=np.uint8)
    verdicts[hidx < 0] = Verdict.MALFORMED_HELPER
    verdicts[lidx < 0] = Verdict.MALFORMED_LEADER
    both = np.flatnonzero((lidx >= 0) & (hidx >= 0))
    if not both.size or mine.prep is None:
        return verdicts.tobytes(), []
    lrows, hrows = lidx[both], hidx[both]
    accepted, msgs = prio.prep_shares_to_prep_rows(
        [leader.verifiers[lrows], helper.verifiers[hrows]],
        [
            None if leader.parts is None else leader.parts[lrows],
            None if helper.parts is None else helper.parts[hrows],
        ],
    )
    rows = np.asarray(mine.index)[both]
    committed = prio.prep_next_rows(mine.prep, msgs, rows)
    verdicts[both[~committed]] = Verdict.JOINT_RANDOMNESS
    verdicts[both[~accepted]] = Verdict.INVALID_PROOF
    return verdicts.tobytes(), rows[accepted & committed].tolist()


def _decode_shares(prio: Prio3, data: Sequence[bytes], who: str) -> _Shares:
    index, blobs = [-1] * len(data), list[bytes]()
    for i, blob in enumerate(data):
        if blob:
            index[i] = len(blobs)
            blobs.append(blob)
    try:
        verifiers, parts = prio.decode_prep_share_rows(blobs)
    except ValueError as exc:
        raise InvalidArgument(f"the {who}'s prep share: {exc}") from None
    return _Shares(index, verifiers, parts)


def _out_words(prio: Prio3, v: Any, mine: _Prepared, rows: list[int]) -> Any:
    """The field words of the sum of this server's output shares in `rows`."""
    outs = None if mine.prep is None else mine.prep.out_shares
    return field_words_rows(prio, v, outs, rows)


class _Prio3Kind:
    """Prio3 reports (range, onehot, multihot): the FLP's prep shares."""

    def __init__(self, v: Validity) -> None:
        self.v, self.prio = v, v.prio3

    def prepare(
        self, key: bytes, agg_id: int, reports: Sequence[tuple[bytes, bytes, bytes]]
    ) -> _Prepared:
        return _prepare(self.prio, key, agg_id, reports)

    def own(self, mine: _Prepared) -> _Shares:
        return _own(mine)

    def decode_shares(self, data: Sequence[bytes], who: str) -> _Shares:
        return _decode_shares(self.prio, data, who)

    def decide(self, mine: _Prepared, leader: _Shares, helper: _Shares) -> tuple[bytes, list[int]]:
        return _decide(self.prio, mine, leader, helper)

    def out_words(self, mine: _Prepared, rows: list[int]) -> Any:
        return _out_words(self.prio, self.v, mine, rows)

    def split_pending(self, blob: bytes) -> tuple[bytes, bytes]:
        return _split_pending(self.prio, blob)


@dataclass
class _SparseState:
    """One server's side of a batch of sparse reports: the sum of the output
    shares of every report it could expand, and those reports (to take the
    refused ones out again)."""

    acc: Any
    reports: list[tuple[bytes, bytes, bytes]]
    verify_key: bytes
    agg_id: int


def _fixed_shares(data: Sequence[bytes], who: str) -> _Shares:
    """Prep shares of PREP_SHARE_SIZE bytes each (b"": none for that report)."""
    index, blobs = [-1] * len(data), list[bytes]()
    for i, blob in enumerate(data):
        if not blob:
            continue
        if len(blob) != PREP_SHARE_SIZE:
            raise InvalidArgument(
                f"the {who}'s prep share {i} is {len(blob)} bytes, not {PREP_SHARE_SIZE}"
            )
        index[i] = len(blobs)
        blobs.append(blob)
    return _Shares(index, blobs, None)


class _SparseKind:
    """Sparse one-hot and multi-hot reports (vdaf/sparse.py): each server expands every
    report's DPF key into running sums as it goes (one per thread; memory
    O(d) per thread and batch, whatever the batch's size), then takes out the
    few reports refused — so valid reports are expanded once."""

    def __init__(self, v: Validity) -> None:
        self.v, self.scheme = v, v.scheme

    def prepare(
        self, key: bytes, agg_id: int, reports: Sequence[tuple[bytes, bytes, bytes]]
    ) -> _Prepared:
        present = [i for i, r in enumerate(reports) if r[0]]
        acc, got = self.scheme.expand_batch(
            agg_id, key, [reports[i] for i in present], EXPAND_THREADS
        )
        index, shares = [-1] * len(reports), [b""] * len(reports)
        kept: list[tuple[bytes, bytes, bytes]] = []
        for i, share in zip(present, got, strict=True):
            if share is not None:
                index[i], shares[i] = len(kept), share
                kept.append(reports[i])
        state = _SparseState(acc, kept, key, agg_id)
        return _Prepared(index, state, tuple(shares))  # type: ignore[arg-type]

    def own(self, mine: _Prepared) -> _Shares:
        blobs = [b for b in mine.shares if b]
        return _Shares(mine.index, blobs, None)

    def decode_shares(self, data: Sequence[bytes], who: str) -> _Shares:
        return _fixed_shares(data, who)

    def decide(self, mine: _Prepared, leader: _Shares, helper: _Shares) -> tuple[bytes, list[int]]:
        verdicts, rows = bytearray(), []
        for i, (li, hi) in enumerate(zip(leader.index, helper.index, strict=True)):
            if li < 0:
                verdicts.append(Verdict.MALFORMED_LEADER)
            elif hi < 0:
                verdicts.append(Verdict.MALFORMED_HELPER)
            else:
                try:
                    ok = self.scheme.decide(leader.verifiers[li], helper.verifiers[hi])
                except SparseError as exc:
                    raise InvalidArgument(f"prep share {i}: {exc}") from None
                verdicts.append(Verdict.VALID if ok else Verdict.INVALID_PROOF)
                if ok and mine.index[i] >= 0:
                    rows.append(mine.index[i])
        return bytes(verdicts), rows

    def out_words(self, mine: _Prepared, rows: list[int]) -> Any:
        """The running sum less the expanded reports not in `rows`."""
        state: _SparseState = mine.prep  # type: ignore[assignment]
        acc = state.acc.copy()
        for r in sorted(set(range(len(state.reports))) - set(rows)):
            nonce, public, share = state.reports[r]
            self.scheme.expand_into(
                acc, state.agg_id, state.verify_key, nonce, public, share, negate=True
            )
        return scaled_words(self.v, acc.value())

    def split_pending(self, blob: bytes) -> tuple[bytes, bytes]:
        size = self.scheme.public_share_bytes()
        return blob[:size], blob[size:]


class _CrawlKind:
    """Strings as incremental DPF keys (vdaf/crawl.py): at ingest each server
    evaluates a report's first level (the root's two children) and both
    check it (exactly one unit there, and the digests agree); valid reports
    are kept whole by both servers for the walks (servers/crawl.py), nothing
    is folded (a crawl task has no sums)."""

    def __init__(self, v: Validity) -> None:
        self.v = v

    def prepare(
        self, key: bytes, agg_id: int, reports: Sequence[tuple[bytes, bytes, bytes]]
    ) -> _Prepared:
        present = [i for i, r in enumerate(reports) if r[0]]
        index, out = [-1] * len(reports), [b""] * len(reports)
        if not present:
            return _Prepared(index, None, tuple(out))
        walk = CrawlReports(self.v.bits, agg_id, key, [reports[i] for i in present])
        shares = walk.extend(1)
        live = walk.live
        for row, i in enumerate(present):
            if live[row]:
                index[i], out[i] = row, shares[row].tobytes()
        return _Prepared(index, None, tuple(out))

    def own(self, mine: _Prepared) -> _Shares:
        return _Shares(mine.index, list(mine.shares), None)

    def decode_shares(self, data: Sequence[bytes], who: str) -> _Shares:
        return _fixed_shares(data, who)

    def decide(self, mine: _Prepared, leader: _Shares, helper: _Shares) -> tuple[bytes, list[int]]:
        lidx, hidx = leader.index, helper.index
        verdicts = bytearray(len(lidx))
        both = [i for i in range(len(lidx)) if lidx[i] >= 0 and hidx[i] >= 0]
        for i in range(len(lidx)):
            if lidx[i] < 0:
                verdicts[i] = Verdict.MALFORMED_LEADER
            elif hidx[i] < 0:
                verdicts[i] = Verdict.MALFORMED_HELPER
        if both:
            a = np.frombuffer(b"".join(leader.verifiers[lidx[i]] for i in both), np.uint8)
            b = np.frombuffer(b"".join(helper.verifiers[hidx[i]] for i in both), np.uint8)
            ok = check_level(
                a.reshape(len(both), -1), b.reshape(len(both), -1), np.ones(len(both), bool)
            )
            for i, good in zip(both, ok, strict=True):
                verdicts[i] = Verdict.VALID if good else Verdict.INVALID_PROOF
        rows = [mine.index[i] for i in both if verdicts[i] == Verdict.VALID]
        return bytes(verdicts), rows

    def out_words(self, mine: _Prepared, rows: list[int]) -> Any:
        """Nothing is folded: the task's one (unused) coordinate stays 0."""
        return scaled_words(self.v, FIELD128.zeros(self.v.d))

    def split_pending(self, blob: bytes) -> tuple[bytes, bytes]:
        size = self.v.public_share_bytes()
        return blob[:size], blob[size:]


IngestKind = _Prio3Kind | _SparseKind | _CrawlKind


def ingest_kind(v: Validity) -> IngestKind:
    """How a task's reports are verified and folded."""
    if v.crawl:
        return _CrawlKind(v)
    return _SparseKind(v) if v.sparse else _Prio3Kind(v)


# ---------------------------------------------------------------- bounds
def check_proof_batch(core: ServerCore, task: TaskState, ids: Sequence[bytes]) -> list[bytes]:
    """`core.check_batch`, and at most `Validity.batch_limit` reports: the bound
    on what the batch's verification allocates, checked before any decoding."""
    v = task_validity(task)
    limit = v.batch_limit(MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES)
    if len(ids) > limit:
        raise ResourceExhausted(
            f"a batch of this task ({v.name}, d={v.d}) holds at most {limit} reports "
            f"(each costs {v.verify_bytes()} bytes to verify), got {len(ids)}"
        )
    return core.check_batch(task, ids)


def pending_cap(task: TaskState) -> int:
    """Unverified reports the helper keeps for a task: its room plus one batch."""
    return max(0, task.params.n_max - task.n) + MAX_BATCH_REPORTS


def binding(task_id: str, ids: Sequence[bytes], leader_prep_shares: Sequence[bytes]) -> bytes:
    """The digest a batch's verdicts are bound to (see the module's retry rule)."""
    h = hashlib.sha256(b"svtagg/verify-binding/v1")
    h.update(len(task_id.encode()).to_bytes(4, "big") + task_id.encode())
    h.update(len(ids).to_bytes(4, "big") + b"".join(ids))
    for share in leader_prep_shares:
        h.update(len(share).to_bytes(4, "big") + share)
    return h.digest()


# ---------------------------------------------------------------- the helper
def helper_receive(core: ServerCore, task_id: str, reports: Sequence[ProofReport]) -> int:
    """The helper's Upload: keep the batch's shares pending, each of exactly the
    circuit's length (a batch holding another length is refused whole), so a
    pending report never holds more than the circuit's few bytes.  Returns 0:
    n is not a client's to know (GetTask withholds it too)."""
    task = core.task(task_id)
    v = task_validity(task)
    ids = check_proof_batch(core, task, [r.report_id for r in reports])
    public, share = v.public_share_bytes(), v.input_share_bytes(1)
    for i, r in enumerate(reports):
        if len(r.public_share) != public or len(r.input_share) != share:
            raise InvalidArgument(
                f"report {i} of the batch: the helper's input share is {share} bytes and the "
                f"public share {public} for this task's circuit, got {len(r.input_share)} "
                f"and {len(r.public_share)} (batch refused, nothing kept)"
            )
    blobs = [r.public_share + r.input_share for r in reports]
    core.store.add_pending(task_id, ids, blobs, cap=pending_cap(task))
    return 0


def _split_pending(prio: Prio3, blob: bytes) -> tuple[bytes, bytes]:
    size = SEED_SIZE * prio.shares if prio.uses_joint_rand else 0
    return blob[:size], blob[size:]


async def helper_verify(core: ServerCore, batch: VerifyBatch) -> VerifyResult:
    """The helper's side of a batch's verification (see the module's text)."""
    task = core.task(batch.task_id)
    v = task_validity(task)
    kind = ingest_kind(v)
    ids = list(batch.ids)
    if len(batch.prep_shares) != len(ids):
        raise InvalidArgument(f"{len(ids)} reports, {len(batch.prep_shares)} prep shares")
    check_proof_batch(core, task, ids)
    bid = batch_id(batch.task_id, ids)
    bound = binding(batch.task_id, ids, batch.prep_shares)
    recorded = core.store.verdicts(batch.task_id, bid)
    if recorded is not None:
        if core.store.verdict_binding(batch.task_id, bid) != bound:
            raise FailedPrecondition(
                "this batch was verified before with other leader shares; a retry must "
                "send the very same reports (refused: nothing of it counted again)"
            )
        return VerifyResult((), recorded, True, task.n)
    blobs = core.store.pending(batch.task_id, ids)
    _check_received(core, batch.task_id, ids, blobs)
    # A report the leader could not decode is refused as such; the helper
    # neither decodes nor expands its own shares of it (an empty nonce).
    reports = [
        (rid, *kind.split_pending(b or b"")) if lp else (b"", b"", b"")
        for rid, b, lp in zip(ids, blobs, batch.prep_shares, strict=True)
    ]
    async with core.verify_slots:
        verdicts, mine, rows, words = await asyncio.to_thread(
            _helper_decide, core, kind, task.verify_key, reports, batch.prep_shares
        )
    valid = [i for i, x in enumerate(verdicts) if x == Verdict.VALID]
    seeds = [kept_of(v, reports[i]) for i in valid]
    try:
        n = core.store.add_reports(
            batch.task_id,
            [ids[i] for i in valid],
            seeds,
            words,
            Verified(bid, verdicts, rejected_counts(verdicts), ids, bound),
        )
    except Exception:
        # Another verification of this very batch recorded it meanwhile: answer
        # from that record, under the retry rule.
        again = core.store.verdicts(batch.task_id, bid)
        if again is None:
            raise
        if core.store.verdict_binding(batch.task_id, bid) != bound:
            raise FailedPrecondition(
                "this batch was verified meanwhile with other leader shares (refused)"
            ) from None
        return VerifyResult((), again, True, core.task(batch.task_id).n)
    crash_point("verify.after_record")  # recorded here, the leader not answered
    return VerifyResult(mine.shares, verdicts, False, n)


def _check_received(
    core: ServerCore, task_id: str, ids: list[bytes], blobs: list[bytes | None]
) -> None:
    """Refuse a batch the helper does not hold whole: AlreadyExists for ids it
    has already counted (a resent part of a verified batch), FailedPrecondition
    for ids it never received."""
    missing = [rid for rid, b in zip(ids, blobs, strict=True) if b is None]
    if not missing:
        return
    counted = core.store.counted(task_id, missing)
    if counted:
        raise AlreadyExists(
            f"{counted} of this batch's {len(ids)} reports were already uploaded and "
            "counted; batch refused (nothing counted twice)"
        )
    raise FailedPrecondition(
        f"the helper has not received {len(missing)} of this batch's {len(ids)} reports; "
        "upload them to the helper first"
    )


def _helper_decide(
    core: ServerCore,
    kind: IngestKind,
    verify_key: bytes,
    reports: list[tuple[bytes, bytes, bytes]],
    leader_prep_shares: Sequence[bytes],
) -> tuple[bytes, _Prepared, list[int], Any]:
    """The helper's verification of a batch, off the event loop: its verdicts,
    its prep shares and the field words of its valid output shares."""
    leader = kind.decode_shares(leader_prep_shares, "leader")
    mine = kind.prepare(verify_key, 1, reports)
    verdicts, rows = _checked(core, kind, mine, leader, kind.own(mine))
    return verdicts, mine, rows, kind.out_words(mine, rows)


def _checked(
    core: ServerCore,
    kind: IngestKind,
    mine: _Prepared,
    leader: _Shares,
    helper: _Shares,
) -> tuple[bytes, list[int]]:
    """The kind's decision, or (the test-only control `core.verify_proofs`
    off) every decodable report taken as valid, unchecked."""
    if core.verify_proofs:
        return kind.decide(mine, leader, helper)
    verdicts = bytes(
        Verdict.MALFORMED_LEADER if lp < 0 else Verdict.MALFORMED_HELPER if hp < 0 else 0
        for lp, hp in zip(leader.index, helper.index, strict=True)
    )
    rows = [r for r, x in zip(mine.index, verdicts, strict=True) if x == 0 and r >= 0]
    return verdicts, rows


# ---------------------------------------------------------------- the leader
async def verify_upload(
    core: ServerCore, helper: HelperPort, task_id: str, reports: Sequence[ProofReport]
) -> Accepted:
    """The leader's Upload of a task with a validity circuit: verify the batch
    with the helper, fold the valid reports, answer with the refusals."""
    task = core.task(task_id)
    if not task.collection_open:
        raise FailedPrecondition(f"collection of task {task_id!r} is closed")
    v = task_validity(task)
    kind = ingest_kind(v)
    ids = check_proof_batch(core, task, [r.report_id for r in reports])
    bid = batch_id(task_id, ids)
    if core.store.verdicts(task_id, bid) is not None:
        raise AlreadyExists("this batch was already uploaded and counted (nothing counted twice)")
    rows = [(r.report_id, r.public_share, r.input_share) for r in reports]
    async with core.verify_slots:
        mine = await asyncio.to_thread(kind.prepare, task.verify_key, 0, rows)
    answer = await helper.verify(VerifyBatch(task_id, tuple(ids), mine.shares))
    if len(answer.verdicts) != len(ids):
        raise PeerUnavailable(f"the helper sent {len(answer.verdicts)} verdicts for {len(ids)}")
    if answer.replayed:
        # The helper recorded this batch before (our earlier answer was lost):
        # its verdicts stand; our output shares are our prep states'.
        verdicts = answer.verdicts
        out_rows = [
            r for r, x in zip(mine.index, verdicts, strict=True) if x == Verdict.VALID and r >= 0
        ]
        if len(out_rows) != sum(x == Verdict.VALID for x in verdicts):
            raise FailedPrecondition("the helper's recorded verdicts do not fit this batch")
    else:
        if len(answer.prep_shares) != len(ids):
            raise PeerUnavailable("the helper sent a prep share count other than the batch's")
        theirs = kind.decode_shares(answer.prep_shares, "helper")
        async with core.verify_slots:
            verdicts, out_rows = await asyncio.to_thread(
                _checked, core, kind, mine, kind.own(mine), theirs
            )
        if verdicts != answer.verdicts:
            raise FailedPrecondition(
                "the servers' verdicts on this batch differ; it is not counted here "
                "(the close takes it out on the helper)"
            )
    valid = [rid for rid, x in zip(ids, verdicts, strict=True) if x == Verdict.VALID]
    counts = rejected_counts(verdicts)
    crash_point("verify.before_record")  # the helper has recorded; not yet here
    words = await asyncio.to_thread(kind.out_words, mine, out_rows)
    # A crawl task's reports are kept whole on the leader too (for the walks).
    kept = [
        kept_of(v, rows[i]) if v.crawl else b""
        for i, x in enumerate(verdicts)
        if x == Verdict.VALID
    ]
    # Recorded under the batch's id here too, so that resending a batch (even
    # one with no valid report) counts its refusals once.
    n = core.store.add_reports(task_id, valid, kept, words, Verified(bid, verdicts, counts, []))
    return Accepted(len(valid), n, counts)
