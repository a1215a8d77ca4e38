"""A task's validity circuit as the servers use it: the circuit named by the
task (`task_validity`), the check a new task's name gets (`check_validity`),
and output shares as the Field128 words the stores fold (`field_words`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from svtagg.dp.errors import FailedPrecondition, InvalidArgument
from svtagg.mpc.ring import U64
from svtagg.servers.store import TaskState
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.prio3 import Prio3
from svtagg.vdaf.validity import Validity, ValidityError, parse_validity


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
    """Refuse (InvalidArgument) a task whose circuit does not parse or fit."""
    try:
        parse_validity(text, d, frac_bits, embedding)
    except ValidityError as exc:
        raise InvalidArgument(str(exc)) from None


def field_words(prio: Prio3, v: Validity, out_shares: Sequence[object]) -> U64:
    """The sum of output shares, scaled to the task's grid, as Field128 words."""
    f = prio.field
    total = f.zeros(prio.flp.output_len)
    if out_shares:
        total = f.sum(np.stack(out_shares), axis=0)  # type: ignore[arg-type]
    if v.scale != 1:
        total = f.mul(total, v.scale)
    return np.frombuffer(FIELD128.encode_vec(total), dtype="<u8").copy()


def helper_undo_sum(task: TaskState, seeds: list[bytes]) -> U64:
    """The helper's output shares of reports it recorded (from their 16-byte
    measurement seeds), as Field128 words: what reconciliation takes out."""
    v = task_validity(task)
    prio = v.prio3
    outs = [prio.flp.truncate(prio.helper_meas_share(1, s)) for s in seeds]
    return field_words(prio, v, outs)
