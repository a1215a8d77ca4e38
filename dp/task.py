"""Task parameters: the public numbers both servers hold identically, and their
validation, including the overflow bound that keeps z_L + z_H from wrapping."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from svtagg.dp.errors import InvalidArgument
from svtagg.dp.jointsvt import INDEPENDENT, JOINT, NOISE_OPTIONS
from svtagg.dp.kinds import StreamKind, as_fraction, check_epsilon, overflow_possible
from svtagg.mpc.ring import MAX_FRAC_BITS

TASK_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Largest d a task may have (one explicit share is 8·d bytes).
MAX_D = 1_000_000


#: An embedding's name as a task records it ("" = none recorded).
EMBEDDING_RE = re.compile(r"[a-z0-9_]{0,32}")
#: A validity circuit's name as a task records it (the servers check that it
#: fits the task: svtagg.vdaf.validity.parse_validity).
VALIDITY_RE = re.compile(
    r"(|range|onehot|sparse-onehot|multihot(:[1-9][0-9]{0,6})?|sparse-multihot:[1-9][0-9]{0,6}"
    r"|sparse-range:[1-9][0-9]{0,6}|crawl:[1-9][0-9]{0,2})"
)


@dataclass(frozen=True)
class TaskParams:
    """Public parameters of a task, identical on both servers."""

    task_id: str
    d: int
    frac_bits: int
    n_max: int
    min_batch: int
    epsilon_total: Fraction
    delta_total: Fraction
    epsilon_min: Fraction
    #: A task created with the retired garbled range check (read from older
    #: stores only: new tasks refuse it and prove validity at ingest instead).
    validate_reports: bool = False
    #: The embedding the task's clients use ("" = not recorded); uploads check it.
    embedding: str = ""
    #: The validity circuit every report proves at ingest (svtagg.vdaf.validity:
    #: range, onehot, sparse-onehot, multihot[:r], sparse-multihot:r, sparse-range:r,
    #: crawl:B); "" = reports
    #: carry no proof.
    validity: str = ""
    #: Where the streams' noise comes from: "independent" (each server draws its
    #: own full-scale noise) or "joint" (one draw of the central noise inside
    #: the garbled circuit, from both servers' random bits: dp/jointsvt.py).
    noise: str = INDEPENDENT

    @property
    def crawl(self) -> bool:
        """A task of strings (validity crawl:B) for the prefix crawl: its reports
        are kept by both servers past the agreement and its only streams are
        crawl levels (servers/crawl.py)."""
        return self.validity.startswith("crawl:")


@dataclass(frozen=True)
class TaskSpec:
    """A task as the analyst proposes it: the numbers as written (rationals as
    exact text, "1/2" or "0.25"), before any check.  `parse_task_params` turns
    it into the `TaskParams` both servers hold, or refuses it."""

    task_id: str
    d: int
    frac_bits: int
    n_max: int
    min_batch: int
    epsilon_total: str
    delta_total: str
    epsilon_min: str
    validate_reports: bool = False
    embedding: str = ""
    validity: str = ""
    noise: str = ""


def parse_task_params(spec: TaskSpec) -> TaskParams:
    """Validate task parameters, including the overflow bound for every stream kind."""
    task_id, d, frac_bits, n_max = spec.task_id, spec.d, spec.frac_bits, spec.n_max
    min_batch, embedding = spec.min_batch, spec.embedding
    if not TASK_ID_RE.fullmatch(task_id):  # match() lets "$" accept a trailing newline
        raise InvalidArgument(f"task id must match {TASK_ID_RE.pattern}, got {task_id!r}")
    if not 1 <= d <= MAX_D:
        raise InvalidArgument(f"d must be in [1, {MAX_D}], got {d}")
    if not 1 <= frac_bits <= MAX_FRAC_BITS:
        raise InvalidArgument(f"frac_bits must be in [1, {MAX_FRAC_BITS}], got {frac_bits}")
    if n_max < 1:
        raise InvalidArgument(f"n_max must be >= 1, got {n_max}")
    if not 1 <= min_batch <= n_max:
        raise InvalidArgument(f"min_batch must be in [1, n_max={n_max}], got {min_batch}")
    try:
        eps_total = check_epsilon(spec.epsilon_total or "")
        eps_min = check_epsilon(spec.epsilon_min or "")
        delta = as_fraction(spec.delta_total or "0", "delta_total")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if not 0 <= delta < 1:
        raise InvalidArgument(f"delta_total must be in [0, 1), got {delta}")
    if eps_min > eps_total:
        raise InvalidArgument(f"epsilon_min={eps_min} exceeds epsilon_total={eps_total}")
    for kind in StreamKind:
        if overflow_possible(n_max, frac_bits, eps_min, kind):
            raise InvalidArgument(
                f"z_L + z_H could wrap mod 2^64 for n_max={n_max}, F={frac_bits}, "
                f"epsilon_min={eps_min} (kind {kind.value}); lower n_max or F, or raise epsilon_min"
            )
    if not EMBEDDING_RE.fullmatch(embedding):
        raise InvalidArgument(f"embedding must match {EMBEDDING_RE.pattern}, got {embedding!r}")
    if not VALIDITY_RE.fullmatch(spec.validity):
        raise InvalidArgument(
            f"validity must be range, onehot, sparse-onehot, multihot, multihot:r, "
            f"sparse-multihot:r, sparse-range:r or crawl:B, "
            f"got {spec.validity!r}"
        )
    noise = spec.noise or INDEPENDENT
    if noise not in NOISE_OPTIONS:
        raise InvalidArgument(f"noise must be independent or joint, got {spec.noise!r}")
    if noise == JOINT and delta == 0:
        raise InvalidArgument(
            "a task with joint noise needs delta_total > 0: each of its streams charges "
            "the sampler's finite-support δ (below 2^-60 per stream; docs/privacy.md)"
        )
    if spec.validate_reports:
        raise InvalidArgument(
            "validate_reports (the garbled range check at the close) is retired: reports "
            "prove their values valid at ingest instead; give the task a validity circuit "
            "(validity=range, onehot or multihot)"
        )
    return TaskParams(
        task_id,
        d,
        frac_bits,
        n_max,
        min_batch,
        eps_total,
        delta,
        eps_min,
        bool(spec.validate_reports),
        embedding,
        spec.validity,
        noise,
    )


def safe_epsilon_min(n_max: int, frac_bits: int) -> Fraction:
    """The smallest ε_min = 2^-k for which no stream kind can wrap z_L + z_H."""
    eps = Fraction(1)
    if any(overflow_possible(n_max, frac_bits, eps, kind) for kind in StreamKind):
        raise InvalidArgument(f"n_max={n_max} with F={frac_bits} can overflow even at ε=1")
    while not any(overflow_possible(n_max, frac_bits, eps / 2, kind) for kind in StreamKind):
        eps /= 2
    return eps
