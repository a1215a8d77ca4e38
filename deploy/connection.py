"""The Python front door: `svtagg.connect(leader, certs=...)`.

A `Deployment` is one mutual-TLS connection to the leader's analyst API, holding
the analyst's certificate.  It lists and creates tasks; `Deployment.task(id)`
returns a `TaskHandle` with the task's state, its budget and the selection
applications as methods.  Numbers come back as floats; every budget figure also
keeps its exact value (`BudgetView.exact`), which is what the servers' ledgers hold.

Data goes in through `Deployment.upload` (needs the client certificate in the
same directory, or `client_certs=`): a numpy array, a pandas DataFrame (pandas
is optional: `pip install svtagg[pandas]`) or any 2-d array-like, checked as
strictly as `svtagg client upload` checks a file.

Leader, helper and certificate directory default to the settings of
`svtagg.deploy.settings` (environment variables, then the config file).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Unpack

import grpc
import numpy as np
import numpy.typing as npt

from svtagg.analyst.crawl import CrawlResult, LevelRecord, crawl, false_positive_floor
from svtagg.analyst.remote_crawl import CrawlStats, RemoteCrawlOracle
from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.client.journal import UploadJournal
from svtagg.client.records import InputError, ReadStats, Spec, default_format, embed_block
from svtagg.client.strings import STRINGS_FORMAT, check_strings_upload, encode_strings
from svtagg.client.upload import (
    Resumable,
    Rows,
    Uploader,
    UploadStats,
    batch_bound,
    task_circuit,
)
from svtagg.deploy.algorithms import RunFlags, run_algorithm
from svtagg.deploy.tasks import TaskOptions, default_validity, task_spec
from svtagg.dp.crawl import CrawlPlan
from svtagg.dp.errors import (
    AlreadyExists,
    BudgetExhausted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Refusal,
)
from svtagg.dp.kinds import StreamKind, as_fraction
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import load_identity, tls_target
from svtagg.proto.vocab import (
    CALL_DEADLINE,
    CHANNEL_OPTIONS,
    KIND_TO_PB,
    Role,
    check_address,
    refusal_from_rpc,
)
from svtagg.vdaf.validity import parse_validity

__all__ = [
    "BudgetView",
    "Deployment",
    "NoiseStatus",
    "TaskHandle",
    "TaskOptions",
    "TaskView",
    "connect",
]


@dataclass(frozen=True)
class NoiseStatus:
    """Prepared joint noise of one shape on a task (`TaskHandle.prepare_noise`):
    samples held on both servers, still to make, the task's bound and what it
    holds over all shapes."""

    held: int
    pending: int
    cap: int
    task_held: int

    @classmethod
    def from_pb(cls, m: pb.PrepareNoiseResponse) -> NoiseStatus:
        return cls(int(m.held), int(m.pending), int(m.cap), int(m.task_held))

    def to_json(self) -> dict[str, int]:
        return {
            "held": self.held,
            "pending": self.pending,
            "cap": self.cap,
            "task_held": self.task_held,
        }


def _fraction(text: str) -> Fraction:
    return Fraction(text) if text else Fraction(0)


@dataclass(frozen=True)
class BudgetView:
    """One server's ledger for a task as the analyst reads it (`svtagg.dp.queries.Budget`
    is the ledger itself): floats, with the exact Fractions in `exact`."""

    epsilon_total: float
    epsilon_spent: float
    delta_total: float
    delta_spent: float
    exact: dict[str, Fraction]

    @classmethod
    def from_pb(cls, b: pb.BudgetStatus) -> BudgetView:
        exact = {
            "epsilon_total": _fraction(b.epsilon_total),
            "epsilon_spent": _fraction(b.epsilon_spent),
            "delta_total": _fraction(b.delta_total),
            "delta_spent": _fraction(b.delta_spent),
        }
        return cls(**{k: float(v) for k, v in exact.items()}, exact=exact)

    @property
    def epsilon_left(self) -> float:
        return float(self.exact["epsilon_total"] - self.exact["epsilon_spent"])

    @property
    def delta_left(self) -> float:
        return float(self.exact["delta_total"] - self.exact["delta_spent"])

    def to_json(self) -> dict[str, Any]:
        """Decimals as numbers plus the exact fractions as strings."""
        out: dict[str, Any] = {k: float(v) for k, v in self.exact.items()}
        out["epsilon_left"] = self.epsilon_left
        out["delta_left"] = self.delta_left
        out["exact"] = {k: str(v) for k, v in self.exact.items()}
        return out

    def __str__(self) -> str:
        return (
            f"ε {format_number(self.exact['epsilon_spent'])} of "
            f"{format_number(self.exact['epsilon_total'])} spent, "
            f"δ {format_number(self.exact['delta_spent'])} of "
            f"{format_number(self.exact['delta_total'])}"
        )


def format_number(x: Fraction | float) -> str:
    """A decimal for people: 6 significant digits, no exponent for ordinary sizes."""
    value = float(x)
    if value == 0:
        return "0"
    if 1e-4 <= abs(value) < 1e7:
        return f"{value:.6g}"
    return f"{value:.4g}"


@dataclass(frozen=True)
class TaskView:
    """A task as the leader describes it to the analyst: public parameters, n, state
    and both ledgers (the servers' own task record is `svtagg.servers.store.rules.TaskState`)."""

    task_id: str
    d: int
    frac_bits: int
    n: int
    n_max: int
    collecting: bool
    streams: int
    #: The embedding the task's clients use ("" = none recorded).
    embedding: str
    #: The validity circuit every report proves at ingest ("" = none).
    validity: str
    budget: BudgetView
    helper_budget: BudgetView | None
    #: Reports the close took out (held by one server only); only a close
    #: reports it, else 0.
    dropped_reports: int = 0
    #: Reports refused at ingest for a failed validity proof, by reason.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Where the streams' noise comes from: independent or joint.
    noise: str = "independent"

    @classmethod
    def from_pb(cls, info: pb.TaskInfo) -> TaskView:
        s = info.spec
        return cls(
            task_id=s.task_id,
            d=int(s.d),
            frac_bits=int(s.frac_bits),
            n=int(info.n),
            n_max=int(s.n_max),
            collecting=bool(info.collection_open),
            streams=int(info.streams),
            embedding=str(s.embedding),
            validity=str(s.validity),
            budget=BudgetView.from_pb(info.budget),
            helper_budget=BudgetView.from_pb(info.helper_budget)
            if info.helper_budget.epsilon_total
            else None,
            dropped_reports=int(info.dropped_reports),
            rejected={k: int(v) for k, v in sorted(info.rejected.items())},
            noise=str(s.noise) or "independent",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task_id,
            "d": self.d,
            "frac_bits": self.frac_bits,
            "n": self.n,
            "n_max": self.n_max,
            "state": "collecting" if self.collecting else "closed",
            "streams": self.streams,
            "embedding": self.embedding or None,
            "validity": self.validity or None,
            "noise": self.noise,
            "rejected": self.rejected,
            "budget": self.budget.to_json(),
            "helper_budget": self.helper_budget.to_json() if self.helper_budget else None,
            "dropped_reports": self.dropped_reports,
        }

    def __str__(self) -> str:
        lines = [
            f"task {self.task_id}: d={self.d} F={self.frac_bits} n={self.n} "
            f"({'collecting' if self.collecting else 'closed'}), streams={self.streams}"
            + (f", embedding {self.embedding}" if self.embedding else "")
            + (f", proofs {self.validity}" if self.validity else "")
            + (", joint noise" if self.noise == "joint" else ""),
            f"  leader ledger: {self.budget}",
        ]
        if self.rejected:
            counts = ", ".join(f"{k} {v}" for k, v in self.rejected.items())
            lines.append(f"  refused at ingest (failed proof): {counts}")
        if self.dropped_reports:
            lines.insert(
                1,
                f"  dropped {self.dropped_reports} reports at the close (held by one server "
                "only, or out of range): n counts only the reports both servers kept",
            )
        if self.helper_budget is not None:
            lines.append(f"  helper ledger: {self.helper_budget}")
        else:
            lines.append("  helper ledger: not available (the leader could not reach the helper)")
        return "\n".join(lines)


def _as_matrix(data: Any) -> npt.NDArray[Any]:
    """A 2-d array from a numpy array, a pandas DataFrame or a nested sequence."""
    to_numpy = getattr(data, "to_numpy", None)
    if callable(to_numpy):  # pandas DataFrame / Series, without importing pandas
        data = to_numpy()
    arr = np.asarray(data)
    if arr.dtype == object:
        raise InputError("data has mixed or non-numeric columns")
    return np.atleast_2d(arr)


class TaskHandle:
    """One task on the deployment: state, budget, collection and the applications.

    The applications open an oracle on the (closed) task and spend its budget
    there; the exact spend is in each result's `spend` and in `budget()`.
    """

    def __init__(self, deployment: Deployment, task_id: str) -> None:
        self.deployment = deployment
        self.task_id = task_id
        self._oracle: RemoteOracle | None = None
        #: What the last `heavy_strings` walk cost (levels, ε, refused reports,
        #: bytes between the servers), also after a walk that failed midway.
        self.crawl_stats: CrawlStats | None = None
        #: The last walk `heavy_strings` ran (its oracle and result so far),
        #: which `heavy_strings(resume=True)` goes on with after a failure.
        self._walk: tuple[RemoteCrawlOracle, CrawlResult] | None = None

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_id!r})"

    def state(self) -> TaskView:
        """n, state, streams and both ledgers (the leader asks the helper)."""
        return TaskView.from_pb(self.deployment._call("DescribeTask", self._ref()))

    def budget(self) -> BudgetView:
        """The leader's ledger for this task."""
        return BudgetView.from_pb(self.deployment._call("Budget", self._ref()).budget)

    def close_collection(self) -> TaskView:
        """Close the collection on both servers; afterwards n is public and fixed.
        Returns the task as `state()` describes it then (both ledgers), with the
        reports the close took out."""
        closed = self.deployment._call("CloseCollection", self._ref())
        return replace(self.state(), dropped_reports=int(closed.dropped_reports))

    def plans(self) -> list[dict[str, str]]:
        """The task's plans still active (reserved and not ended): what a run
        that failed left reserved.  `Deployment.end_plan` ends one."""
        listing = self.deployment._call("ListPlans", self._ref())
        return [plan_json(p) for p in listing.plans]

    def oracle(self) -> RemoteOracle:
        """The `Oracle` over this closed task, for `svtagg.analyst` algorithms."""
        if self._oracle is None:
            d = self.deployment
            self._oracle = RemoteOracle(d.leader, self.task_id, d._ca, d._cert, d._key)
        return self._oracle

    def run(self, algorithm: str, epsilon: float | str, **flags: Any) -> dict[str, Any]:
        """Run one algorithm exactly as `svtagg analyst run` does, through the same
        code (`deploy.algorithms.run_algorithm`): every option is checked, and the
        run's whole ε reserved on both servers as one plan, before any stream
        opens, so a request that cannot finish is refused with nothing spent.
        `flags` are `RunFlags`' (k, index, kind, seed, shares, beta, p, bound,
        clip, attributes, rounds, delta).  Returns the summary the command prints
        (without the budget figures: `budget()` has them).  Refusals are
        `svtagg.dp.errors.Refusal` (InvalidArgument for a bad option,
        BudgetExhausted when the budget left cannot hold ε, PeerUnavailable when
        a server cannot be reached)."""
        unknown = set(flags) - {f.name for f in fields(RunFlags)}
        if unknown:
            raise InvalidArgument(f"unknown option(s) {', '.join(sorted(unknown))}")
        run = RunFlags(algorithm=algorithm, epsilon=epsilon, **flags)
        try:
            return run_algorithm(self.oracle(), run)
        except grpc.RpcError as exc:
            raise refusal_from_rpc(exc) from None
        except Refusal:
            raise
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def top_k(
        self,
        k: int,
        epsilon: float | str,
        *,
        kind: str | None = None,
        shares: str | None = None,
        seed: int | None = None,
    ) -> list[int]:
        """Private top-k heavy hitters (Theorem 7.1, by scan selection as `svtagg
        analyst run --algorithm top-k`) on data uploaded with the heavy_hitters
        embedding: the k category ids, most frequent first-ish."""
        out = self.run("top-k", epsilon, k=k, kind=kind, shares=shares, seed=seed)
        return [int(i) for i in out["selected"]]

    def sum(self, index: int, epsilon: float | str, beta: float = 0.05) -> dict[str, float]:
        """Corollary 6.8: an interval containing coordinate `index`'s sum w.p. ≥ 1 − β."""
        out = self.run("sum", epsilon, index=index, beta=beta)
        return {"estimate": out["estimate"], "lower": out["lower"], "upper": out["upper"]}

    def sparse_mean(
        self, k: int, epsilon: float | str, clip: float, beta: float = 0.05
    ) -> npt.NDArray[np.float64]:
        """Sparse mean estimation (§7.2) on data uploaded with sparse_mean(clip):
        the mean vector, zero off the k coordinates it selected."""
        out = self.run("sparse-mean", epsilon, k=k, clip=clip, beta=beta)
        mean = np.zeros(self.oracle().d)
        for j, value in out["mean"].items():
            mean[int(j)] = value
        return mean

    def prepare_noise(
        self,
        kind: str,
        epsilon: float | str | Fraction,
        count: int = 0,
        *,
        wait: bool = False,
        progress: Callable[[NoiseStatus], None] | None = None,
        timeout: float | None = None,
    ) -> NoiseStatus:
        """A joint-noise task: ask the leader to hold `count` samples of the
        sampler shape (kind, ε) — the noise of that many queries of a lap24,
        lap3 or exp3 stream at that ε — made while no chunk runs, so a run
        whose streams take that shape finds it ready (docs/services.md,
        "Prepared noise").  A level, not an increment; count 0 only reports.
        Allowed while the collection is open; charges nothing.  With `wait`,
        polls once a second until nothing is pending (`progress` sees each
        status), TimeoutError after `timeout` seconds.  What it cannot make
        (the task's bound of prepared samples reached, a batch that failed) is
        not pending either: compare `held` with `count`.  Refusals:
        InvalidArgument (not a joint task, a kind or ε its streams cannot
        take, a count above the bound), FailedPrecondition."""
        try:
            pb_kind = KIND_TO_PB[StreamKind.parse(kind)]
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        request = pb.PrepareNoiseRequest(
            task_id=self.task_id, kind=pb_kind, epsilon=str(epsilon), count=int(count)
        )
        start = time.monotonic()
        while True:
            status = NoiseStatus.from_pb(self.deployment._call("PrepareNoise", request))
            if progress is not None:
                progress(status)
            if not wait or status.pending == 0:
                return status
            if timeout is not None and time.monotonic() - start > timeout:
                raise TimeoutError(f"{status.pending:,} samples still pending after {timeout} s")
            request.count = 0  # the level is asked for: from now on, only report
            time.sleep(1.0)

    def crawl_bits(self, view: TaskView | None = None) -> int:
        """B of a crawl task (validity crawl:B); InvalidArgument for another task."""
        view = view if view is not None else self.state()
        try:
            validity = parse_validity(view.validity, view.d, view.frac_bits, view.embedding)
        except ValueError as exc:
            raise InvalidArgument(f"task {self.task_id!r}: {exc}") from None
        if validity is None or not validity.crawl:
            raise InvalidArgument(
                f"task {self.task_id!r} is not a crawl task (validity {view.validity or 'none'}): "
                "heavy_strings walks a task of strings, created with validity crawl:B"
            )
        return validity.bits

    def crawl_oracle(self, bits: int | None = None) -> RemoteCrawlOracle:
        """A `analyst.crawl.LevelOracle` over this task through the leader
        (`svtagg.analyst.crawl.crawl` walks it): one walk, level 1 first."""
        return RemoteCrawlOracle(self.deployment._stub, self.task_id, bits=bits)

    def heavy_strings(
        self,
        epsilon: float | str | Fraction,
        *,
        stride: int = 8,
        threshold: int | None = None,
        max_kept: int = 64,
        progress: Callable[[LevelRecord], None] | None = None,
        resume: bool = False,
    ) -> CrawlResult:
        """Heavy hitters over the strings of a crawl task (validity crawl:B),
        by the prefix crawl through the servers (`analyst.crawl.crawl`, as
        `svtagg analyst crawl` runs it): ⌈B/stride⌉ levels, each extending
        the kept prefixes by `stride` bits at ε/levels, keeping those whose
        noisy count is at least `threshold` (None: the plan's false-positive
        floor, `false_positive_floor(ε/levels, max_kept · 2^stride)`, at least
        1).  A level keeping more than `max_kept` prefixes, or none, ends the
        walk early (`stopped` says why; the levels not run are not spent).
        Returns the `CrawlResult`: `strings()` the heavy strings, `found`
        them as B-bit integers, `levels` each level's sizes, `epsilon_spent`.
        `progress` sees each level's `LevelRecord` as it ends.

        Checked before any level runs, nothing spent: a task that is not a
        crawl task, or still collecting, a plan out of range (InvalidArgument)
        and an ε above what the leader's ledger has left (BudgetExhausted).
        Each level charges its ε on both servers as it runs, so a walk that
        fails midway (a server lost) has spent the levels it ran:
        `crawl_stats` says what.  `resume=True` (the same arguments) goes on
        with that walk from its last completed level instead of starting
        another: the level that failed is asked again, charged again, and the
        servers rebuild their side from their records (a restart included)."""
        if resume:
            if self._walk is None or self._walk[1].done:
                raise FailedPrecondition(
                    f"no walk of task {self.task_id!r} to resume: the last one ended, "
                    "or none ran from this handle"
                )
            oracle, partial = self._walk
            plan = crawl_plan(self.crawl_bits(self.state()), epsilon, stride, threshold, max_kept)
            left = plan.epsilon - partial.epsilon_spent
            self._check_left(left)
            return crawl(oracle, plan, progress, resume=partial)
        view = self.state()
        bits = self.crawl_bits(view)
        if view.collecting:
            raise FailedPrecondition(
                f"task {self.task_id!r} is still collecting: close its collection before walking"
            )
        plan = crawl_plan(bits, epsilon, stride, threshold, max_kept)
        self._check_left(plan.epsilon, view)
        oracle = self.crawl_oracle(bits)
        self.crawl_stats = oracle.stats
        result = CrawlResult(plan, [])
        self._walk = (oracle, result)
        return crawl(oracle, plan, progress, resume=result)

    def _check_left(self, needed: Fraction, view: TaskView | None = None) -> None:
        """BudgetExhausted, nothing spent, when the leader's ledger holds less
        than `needed`."""
        view = view or self.state()
        left = view.budget.exact["epsilon_total"] - view.budget.exact["epsilon_spent"]
        if needed > left:
            raise BudgetExhausted(
                f"the walk's ε {needed} is more than the {left} task "
                f"{self.task_id!r} has left: nothing spent"
            )

    def walk_record(self) -> dict[str, Any] | None:
        """The walk `heavy_strings` left unfinished (a level failed), as JSON
        data a later process can give `restore_walk`; None when there is none."""
        if self._walk is None or self._walk[1].done:
            return None
        oracle, r = self._walk
        p = r.plan
        return {
            "task": self.task_id,
            "plan": {
                "bits": p.bits,
                "stride": p.stride,
                "epsilon": str(p.epsilon),
                "threshold": p.threshold,
                "max_kept": p.max_kept,
            },
            "walk_id": oracle.walk_id,
            "depth": r.depth,
            "kept": [f"{x:x}" for x in r.kept],
            "levels": [[lv.level, lv.prefix_bits, lv.candidates, lv.kept] for lv in r.levels],
            "epsilon_spent": str(r.epsilon_spent),
        }

    def restore_walk(self, record: dict[str, Any]) -> CrawlPlan:
        """Take up a walk `walk_record` wrote (another process's, say), so that
        `heavy_strings(resume=True)` goes on with it; returns its plan.
        InvalidArgument for a record of another task or one that does not parse."""
        try:
            if record["task"] != self.task_id:
                raise InvalidArgument(
                    f"the walk record is of task {record['task']!r}, not {self.task_id!r}"
                )
            p = record["plan"]
            plan = CrawlPlan(
                int(p["bits"]),
                int(p["stride"]),
                Fraction(p["epsilon"]),
                int(p["threshold"]),
                int(p["max_kept"]),
            )
            levels = [LevelRecord(*(int(x) for x in lv)) for lv in record["levels"]]
            result = CrawlResult(
                plan,
                [],
                levels,
                Fraction(record["epsilon_spent"]),
                kept=[int(x, 16) for x in record["kept"]],
                depth=int(record["depth"]),
            )
            walk_id = str(record["walk_id"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise InvalidArgument(f"the walk record does not parse: {exc}") from None
        oracle = self.crawl_oracle(plan.bits)
        if levels:
            oracle.walk_id, oracle.depth, oracle.level = walk_id, result.depth, levels[-1].level
        oracle.stats.levels = len(levels)
        oracle.stats.epsilon_spent = result.epsilon_spent
        self.crawl_stats = oracle.stats
        self._walk = (oracle, result)
        return plan

    def upload_strings(
        self,
        strings: Any,
        *,
        batch: int = 1000,
        journal: str | Path | bool | None = None,
        resume: bool = False,
    ) -> UploadStats:
        """Upload one string per user to this crawl task: `Deployment.upload`
        with fmt="strings" (checked, journaled and counted once as it is)."""
        return self.deployment.upload(
            self.task_id, strings, fmt=STRINGS_FORMAT, batch=batch, journal=journal, resume=resume
        )

    def close(self) -> None:
        if self._oracle is not None:
            self._oracle.close()
            self._oracle = None

    def _ref(self) -> pb.TaskRef:
        return pb.TaskRef(task_id=self.task_id)


class Deployment:
    """A connection to a deployment's leader as the analyst (see `connect`)."""

    def __init__(
        self,
        leader: str,
        certs: str | Path,
        *,
        helper: str | None = None,
        client_certs: str | Path | None = None,
        timeout: float = CALL_DEADLINE,
    ) -> None:
        ident = load_identity(certs, Role.ANALYST)
        self.leader = leader
        self.helper = helper
        self.certs = Path(certs)
        self.client_certs = Path(client_certs) if client_certs is not None else self.certs
        self.timeout = timeout
        self._ca, self._cert, self._key = ident.ca, ident.cert, ident.key
        creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
        self._channel = grpc.secure_channel(
            leader, creds, options=[*CHANNEL_OPTIONS, *tls_target(Role.LEADER)]
        )
        self._stub = pb_grpc.AnalystStub(self._channel)
        self._handles: list[TaskHandle] = []

    def __repr__(self) -> str:
        return f"Deployment(leader={self.leader!r}, certs={str(self.certs)!r})"

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for h in self._handles:
            h.close()
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        """One analyst call; a failure is raised as its `Refusal` (the front
        door's one exception family), never as a raw gRPC error."""
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise refusal_from_rpc(exc) from None

    def end_plan(self, plan_id: str) -> dict[str, str]:
        """End a plan on both servers (idempotent): what its streams did not use
        comes back to the task (`refunded_epsilon`, `refunded_delta`)."""
        return plan_json(self._call("EndPlan", pb.PlanRef(plan_id=plan_id)))

    def tasks(self) -> list[TaskView]:
        """Every task on the leader, with n, state and the leader's ledger."""
        listing = self._call("ListTasks", pb.Empty())
        return [TaskView.from_pb(t) for t in listing.tasks]

    def task(self, task_id: str) -> TaskHandle:
        """A handle on an existing task (NotFound if the leader has none by that id)."""
        names = {t.task_id for t in self.tasks()}
        if task_id not in names:
            raise NotFound(f"no task {task_id!r} on {self.leader}")
        handle = TaskHandle(self, task_id)
        self._handles.append(handle)
        return handle

    def create_task(
        self,
        task_id: str,
        d: int,
        epsilon: float | str,
        *,
        n_max: int = 1_000_000,
        **options: Unpack[TaskOptions],
    ) -> TaskHandle:
        """Create a task on both servers with total budget (ε, δ); decimals and
        exact fractions ("1/2") are both accepted and stored exactly.
        `options` (`TaskOptions`): delta (default "1/1000000"), min_batch (default
        100), frac_bits, validity, epsilon_min, and `embedding`, which
        records what the clients use (heavy_hitters, sparse_mean, marginals,
        fp_loss, or vectors); uploads embedded otherwise are refused."""
        settings: TaskOptions = {"delta": "1/1000000", "min_batch": 100, **options}
        if "validity" not in options:  # as `svtagg analyst create-task` chooses
            settings["validity"] = default_validity(options.get("embedding", ""))[0]
        elif settings["validity"] == "none":
            settings["validity"] = ""
        self._call("CreateTask", task_spec(task_id, d, n_max, epsilon, **settings))
        handle = TaskHandle(self, task_id)
        self._handles.append(handle)
        return handle

    def create_string_task(
        self,
        task_id: str,
        epsilon: float | str | Fraction,
        *,
        bits: int = 64,
        n_max: int = 1_000_000,
        min_batch: int = 100,
    ) -> TaskHandle:
        """A task of strings of `bits` bits (B/8 bytes) for the prefix crawl:
        validity crawl:B, d = 1, embedding strings, δ = 0 (a walk is pure
        ε-DP); `upload_strings` then `heavy_strings` on the handle."""
        return self.create_task(
            task_id,
            1,
            str(epsilon),
            n_max=n_max,
            validity=f"crawl:{bits}",
            embedding="strings",
            delta="0",
            min_batch=min_batch,
        )

    def upload(
        self,
        task_id: str,
        data: Any,
        *,
        embedding: str | None = None,
        fmt: str | None = None,
        clip: bool = False,
        batch: int = 1000,
        journal: str | Path | bool | None = None,
        resume: bool = False,
        **params: Any,
    ) -> UploadStats:
        """Share and upload one report per row of `data` (numpy array, pandas
        DataFrame or 2-d sequence) to both servers as a client.

        The rows are checked like `svtagg client upload` checks a file, every
        row before anything is sent: values outside the range, NaN and inf are
        refused (InputError naming the row and column) unless `clip` where
        clipping is the documented bound, and so is a row the task's validity
        circuit does not take.  Needs `helper=` and a client certificate
        (`client_certs=`, default `certs`).

        Counted once, as the CLI's upload is: the upload keeps a journal (its
        secret key and progress; default `upload_journal_path`, under
        SVTAGG_STATE_DIR or ~/.local/state/svtagg, named by the task, the rows
        and the deployment's CA), so the same rows uploaded again to the same
        task of the same deployment are refused (AlreadyExists, nothing
        sent) instead of counted twice, and an interrupted upload is refused
        (FailedPrecondition) until `resume=True` continues it.  `journal=PATH`
        keeps it elsewhere; `journal=False` keeps none: every call then counts
        its rows as new users.

        A crawl task (validity crawl:B) takes strings instead, one per user
        (a list of str, a pandas Series or one-column DataFrame; `fmt`
        "strings" or None; `TaskHandle.upload_strings` is the same call): each
        is refused, naming its row, when longer than B/8 bytes in UTF-8 or
        holding NUL, and fmt="strings" for another task is refused too
        (InputError, nothing sent)."""
        if self.helper is None:
            raise InvalidArgument("upload needs the helper's address: connect(..., helper=...)")
        given = fmt
        if fmt != STRINGS_FORMAT:
            fmt = fmt or default_format(embedding)
            if fmt is None:
                raise InputError(f"embedding {embedding} needs fmt='categories' or fmt='matrix'")
        ident = load_identity(self.client_certs, Role.CLIENT)
        with Uploader(self.leader, self.helper, ident.ca, ident.cert, ident.key) as up:
            try:
                info = up.task(task_id)
            except grpc.RpcError as exc:
                raise refusal_from_rpc(exc) from None
            validity = task_circuit(info.spec)
            if fmt == STRINGS_FORMAT or (validity is not None and validity.crawl):
                unused = ["clip"] * clip + [f"{k}=" for k in sorted(params)]
                bits = check_strings_upload(info.spec, given, embedding, unused)
                size = max(1, min(batch, batch_bound(info.spec)))
                values = encode_strings(_string_rows(data), bits)
                if not values:
                    raise InputError("no strings to upload")
                blocks: list[Rows] = [values[i : i + size] for i in range(0, len(values), size)]
                options = {"format": STRINGS_FORMAT, "bits": bits, "batch": size}
                job = _Job(task_id, blocks, info, options, ident.ca)
                return _upload_job(up, job, journal, resume)
            info = up.checked_task(task_id, False, embedding or "vectors", info=info)
            spec = Spec(
                int(info.spec.d), fmt, embedding, params, clip=clip,
                validity=task_circuit(info.spec),
            )  # fmt: skip
            rows: Any = _category_rows(data) if fmt == "categories" else _as_matrix(data)
            stats = ReadStats()
            size = max(1, min(batch, batch_bound(info.spec)))
            blocks = [
                embed_block(spec, rows[i : i + size], i + 1, stats)
                for i in range(0, len(rows), size)
            ]
            if not blocks:
                raise InputError("no rows to upload")
            options = {"d": spec.d, "embedding": embedding, "format": fmt, "params": params,
                       "clip": clip, "batch": size}  # fmt: skip
            return _upload_job(up, _Job(task_id, blocks, info, options, ident.ca), journal, resume)


@dataclass(frozen=True)
class _Job:
    """An upload of Python data, its rows checked and cut into batches: the
    task, the blocks, the task's info, what made the rows (the journal's
    options) and the deployment's CA."""

    task_id: str
    blocks: list[Rows]
    info: pb.TaskInfo
    options: dict[str, Any]
    ca: bytes


def _upload_job(
    up: Uploader, job: _Job, journal: str | Path | bool | None, resume: bool
) -> UploadStats:
    """Send `job` under its journal (see `Deployment.upload`), or without one."""
    if journal is False:
        return _send(up, job.task_id, job.blocks, job.info)
    # A deployment is its CA: the same rows to another deployment's task of
    # the same name are another upload.
    digest = _digest(job.blocks, {**job.options, "ca": hashlib.sha256(job.ca).hexdigest()})
    path = Path(journal) if isinstance(journal, str | Path) else None
    path = path or upload_journal_path(job.task_id, digest)
    return _journaled(up, job.task_id, job.blocks, job.info, path, digest, job.options, resume)


def _send(
    up: Uploader,
    task_id: str,
    blocks: list[Rows],
    info: pb.TaskInfo,
    resume: Resumable | None = None,
    stats: UploadStats | None = None,
) -> UploadStats:
    try:
        return up.upload_blocks(task_id, blocks, info=info, resume=resume, stats=stats)
    except grpc.RpcError as exc:
        raise refusal_from_rpc(exc) from None


def _digest(blocks: list[Rows], options: dict[str, Any]) -> str:
    """SHA-256 of the embedded rows (or strings, as their integers) and the
    options that made them."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for b in blocks:
        if isinstance(b, np.ndarray):
            h.update(np.ascontiguousarray(b, dtype=np.float64).tobytes())
        else:
            h.update(b"".join(int(v).to_bytes(32, "big") for v in b))
    return h.hexdigest()


def walk_journal_path(task_id: str, ca: bytes) -> Path:
    """Where `svtagg analyst crawl` records a walk of this task of this
    deployment (its CA) that failed midway, for `--resume`."""
    root = os.environ.get("SVTAGG_STATE_DIR") or Path.home() / ".local" / "state" / "svtagg"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:64]
    return Path(root) / "walks" / f"{safe}-{hashlib.sha256(ca).hexdigest()[:16]}.json"


def upload_journal_path(task_id: str, digest: str) -> Path:
    """Where `Deployment.upload` keeps the journal of these rows for this task."""
    root = os.environ.get("SVTAGG_STATE_DIR") or Path.home() / ".local" / "state" / "svtagg"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:64]
    return Path(root) / "uploads" / f"{safe}-{digest[:24]}.json"


def _journaled(
    up: Uploader,
    task_id: str,
    blocks: list[Rows],
    info: pb.TaskInfo,
    path: Path,
    digest: str,
    options: dict[str, Any],
    resume: bool,
) -> UploadStats:
    """The upload of `blocks` under the journal at `path` (see `Deployment.upload`)."""
    total = sum(len(b) for b in blocks)
    fresh = UploadJournal(task_id, "<python data>", total, digest, options, total)
    if path.exists():
        recorded = UploadJournal.load(path)
        if recorded.done:
            raise AlreadyExists(
                f"these {recorded.rows:,} rows were already uploaded to task {task_id!r} "
                f"(journal {path}): nothing sent; to upload them again as new users pass "
                "journal=False or delete the journal"
            )
        why = recorded.differs(fresh)
        if why is not None:
            raise FailedPrecondition(
                f"cannot continue from journal {path}: {why}; {recorded.start_over(path)}"
            )
        if not resume:
            raise FailedPrecondition(
                f"an upload of these rows to task {task_id!r} was interrupted "
                f"({recorded.held()}; journal {path}): resume=True continues it; "
                f"{recorded.start_over(path)}"
            )
        fresh = recorded
    elif resume:
        raise FailedPrecondition(f"no upload journal {path} to resume: nothing sent")
    else:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh.create(path)  # the key is on disk before any report leaves
    size = int(options["batch"])
    start = min(fresh.leader_rows, fresh.helper_rows) // size * size

    def record(stats: UploadStats) -> None:
        fresh.leader_rows, fresh.helper_rows = stats.held
        fresh.save(path)

    rest = _rows_from(blocks, start)
    stats = UploadStats(held=[fresh.leader_rows, fresh.helper_rows])
    return _send(up, task_id, rest, info, Resumable(fresh.upload_key, start, record), stats)


def _rows_from(blocks: list[Rows], start: int) -> list[Rows]:
    """The blocks' rows from row `start` on."""
    out: list[Rows] = []
    seen = 0
    for b in blocks:
        if seen + len(b) > start:
            out.append(b[max(0, start - seen) :])
        seen += len(b)
    return out


def crawl_plan(
    bits: int,
    epsilon: float | str | Fraction,
    stride: int = 8,
    threshold: int | None = None,
    max_kept: int = 64,
) -> CrawlPlan:
    """A walk's plan over strings of `bits` bits, every figure checked
    (InvalidArgument); threshold None: the plan's false-positive floor,
    `false_positive_floor(ε/levels, max_kept · 2^stride)`, at least 1."""
    try:
        eps = as_fraction(epsilon, "epsilon")
        plan = CrawlPlan(bits, stride, eps, 1 if threshold is None else threshold, max_kept)
        if threshold is None:
            floor = false_positive_floor(plan.level_epsilon, max_kept << stride)
            plan = replace(plan, threshold=max(1, floor))
    except InvalidArgument:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(str(exc)) from None
    return plan


def connect(
    leader: str | None = None,
    certs: str | Path | None = None,
    *,
    helper: str | None = None,
    client_certs: str | Path | None = None,
    timeout: float = CALL_DEADLINE,
) -> Deployment:
    """Connect to a deployment's leader as the analyst.

    leader: "host:port"; certs: a directory with ca.pem, analyst.pem and
    analyst.key (as `svtagg certs` writes).  Either may be omitted when set in
    the environment (SVTAGG_LEADER, SVTAGG_CERTS) or the config file; helper
    likewise (SVTAGG_HELPER), needed only for `upload`.  The certificate is
    checked here (role analyst, issued by ca.pem); the leader is first
    contacted by the first call."""
    from svtagg.deploy.settings import resolve

    found = resolve()
    leader = leader or found.get("leader", ("", ""))[0]
    certs = certs or found.get("certs", ("", ""))[0]
    helper = helper or found.get("helper", ("", ""))[0] or None
    if not leader:
        raise ValueError("no leader address: pass leader= or set SVTAGG_LEADER")
    if not certs:
        raise ValueError("no certificate directory: pass certs= or set SVTAGG_CERTS")
    check_address(leader, "leader")
    if helper:
        check_address(helper, "helper")
    return Deployment(leader, certs, helper=helper, client_certs=client_certs, timeout=timeout)


def plan_json(p: pb.PlanInfo) -> dict[str, str]:
    """A plan as the front door and `svtagg analyst plans --json` show it
    (amounts as exact text)."""
    return {
        "plan_id": p.plan_id,
        "task_id": p.task_id,
        "epsilon": p.epsilon,
        "delta": p.delta,
        "rule": p.rule,
        "state": p.state,
        "refunded_epsilon": p.refunded_epsilon or "0",
        "refunded_delta": p.refunded_delta or "0",
    }


def _string_rows(data: Any) -> list[Any]:
    """Strings as one entry per user: a list or any iterable of str, a pandas
    Series, a one-column DataFrame, a numpy array of str."""
    if isinstance(data, str | bytes):
        raise InputError("strings: a list of strings (one per user), not one string")
    if hasattr(data, "itertuples"):  # pandas DataFrame: its one column, not its labels
        if len(data.columns) != 1:
            raise InputError(f"strings: a DataFrame of one column, got {len(data.columns)}")
        data = data.iloc[:, 0]
    return list(data.tolist() if hasattr(data, "tolist") else data)


def _category_rows(data: Any) -> list[Any]:
    """Category input as one entry per user: a DataFrame's rows (not its column
    labels, which iterating it would give), a Series' or array's entries."""
    if hasattr(data, "itertuples"):  # pandas DataFrame
        return [list(row) for row in data.itertuples(index=False)]
    entries = data.tolist() if hasattr(data, "tolist") else list(data)  # array, Series
    return [e if isinstance(e, list | tuple) else [e] for e in entries]
