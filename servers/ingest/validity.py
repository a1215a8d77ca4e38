"""A task's validity circuit as the servers use it: the circuit named by the
task (`task_validity`), the check a new task's name gets (`check_validity`),
and output shares as the Field128 words the stores fold (`field_words`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from svtagg.dp.errors import FailedPrecondition, InvalidArgument
from svtagg.mpc.ring import U64
from svtagg.proto.terms import MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
from svtagg.servers.store.rules import TaskState
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.prio3 import Prio3
from svtagg.vdaf.sparse import NONCE_SIZE
from svtagg.vdaf.validity import Validity, ValidityError, parse_validity
from svtagg.vdaf.xof import SEED_SIZE


@lru_cache(maxsize=64)
def _validity(text: str, d: int, frac_bits: int, embedding: str) -> Validity:
    v = parse_validity(text, d, frac_bits, embedding)
    if v is None:
        raise FailedPrecondition("the task takes no validity proofs")
    return v


def task_validity(task: TaskState) -> Validity:
    """The task's circuit (FailedPrecondition for a task without one)."""
    p = task.params
    try:
        return _validity(p.validity, p.d, p.frac_bits, p.embedding)
    except ValidityError as exc:
        raise InvalidArgument(str(exc)) from None


def check_validity(text: str, d: int, frac_bits: int, embedding: str) -> None:
    """Refuse (InvalidArgument) a task whose circuit does not parse or fit, or
    one of whose reports alone would not fit an upload message or the bound on
    a batch's verification."""
    try:
        v = parse_validity(text, d, frac_bits, embedding)
    except ValidityError as exc:
        raise InvalidArgument(str(exc)) from None
    if v is not None and not v.batch_limit(MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES):
        size = v.input_share_bytes(0) + v.public_share_bytes()
        bounded = v.sparse and v.max_items  # a row of at most r items
        advice = "a smaller r or d" if bounded else "a smaller d (or a 0/1 circuit)"
        raise InvalidArgument(
            f"one {v.label} report at d={d}, F={frac_bits} is {size:,} bytes to the leader "
            f"and costs {v.verify_bytes():,} bytes to verify, over the "
            f"{MAX_MESSAGE_BYTES >> 20} MiB message or {MAX_VERIFY_BYTES >> 20} MiB "
            f"verification bound: choose {advice}"
        )


def scaled_words(v: Validity, total: Any) -> U64:
    """A Field128 sum of output shares, scaled to the task's grid, as the
    Field128 words the stores fold."""
    if v.scale != 1:
        total = FIELD128.mul(total, v.scale)
    return np.frombuffer(FIELD128.encode_vec(total), dtype="<u8").copy()


def field_words(prio: Prio3, v: Validity, out_shares: Sequence[object]) -> U64:
    """The sum of output shares, scaled to the task's grid, as Field128 words."""
    f = prio.field
    total = f.zeros(prio.flp.output_len)
    if out_shares:
        total = f.sum(np.stack(out_shares), axis=0)  # type: ignore[arg-type]
    return scaled_words(v, total)


def field_words_rows(prio: Prio3, v: Validity, out_shares: Any, rows: Sequence[int]) -> U64:
    """`field_words` of the rows `rows` (increasing) of a matrix of output shares
    (None when there are none): when most rows count, the matrix's sum less the
    few left out, so the big matrix is never copied."""
    f = prio.field
    if out_shares is None or not rows:
        return field_words(prio, v, [])
    total = f.sum(out_shares, axis=0)
    if len(rows) < out_shares.shape[0]:
        left_out = sorted(set(range(out_shares.shape[0])) - set(rows))
        if len(left_out) <= len(rows):
            total = f.sub(total, f.sum(out_shares[left_out], axis=0))
        else:
            total = f.sum(out_shares[list(rows)], axis=0)
    return field_words(prio, v, [total])


#: Threads one server expands a batch of sparse reports on (the native
#: expansion runs without the GIL): the machine's CPUs, at most 8.
EXPAND_THREADS = min(8, os.cpu_count() or 1)


def kept_of(v: Validity, report: tuple[bytes, bytes, bytes]) -> bytes:
    """What the helper keeps of a counted report (id, public share, its input
    share) to take it out again at the close: a Prio3 report's 16-byte
    measurement seed; a sparse report's id (the DPF's nonce), public share
    and key, 292 bytes at d = 10⁴ (it has no shorter seed of its share)."""
    if v.sparse or v.crawl:
        return report[0] + report[1] + report[2]
    return report[2][:SEED_SIZE]


def report_of(v: Validity, kept: bytes) -> tuple[bytes, bytes, bytes]:
    """A sparse or crawl report from what `kept_of` kept of it: (id, public
    share, input share); the report id is the DPF's nonce."""
    size, n = v.public_share_bytes(), NONCE_SIZE
    return kept[:n], kept[n : n + size], kept[n + size :]


def helper_undo_sum(task: TaskState, kept: list[bytes]) -> U64:
    """The helper's output shares of reports it recorded, from what `kept_of`
    kept of each, as Field128 words: what reconciliation takes out."""
    v = task_validity(task)
    if v.crawl:  # nothing of a crawl report is in the sums
        return scaled_words(v, FIELD128.zeros(v.d))
    if v.sparse:
        reports = [report_of(v, b) for b in kept]
        acc, shares = v.scheme.expand_batch(1, task.verify_key, reports, EXPAND_THREADS)
        if any(share is None for share in shares):
            # a kept report that no longer expands would leave its share in
            # the sums: the close must not go on with a wrong total
            raise FailedPrecondition("a report the helper kept no longer expands")
        return scaled_words(v, acc.value())
    prio = v.prio3
    outs = [prio.flp.truncate(prio.helper_meas_share(1, s)) for s in kept]
    return field_words(prio, v, outs)
