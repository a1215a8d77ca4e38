"""Jobs against a deployment: `svtagg analyst …` (task admin and selection runs on
the remote oracle; the algorithms are `svtagg.deploy.algorithms`' registry),
`svtagg demo` (the whole system on this machine) and `svtagg sim` (multi-process
simulation writing a JSON report)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt

from svtagg.client.embeddings import heavy_hitters_embedding
from svtagg.deploy.algorithms import ALGORITHMS, RunFlags, run_algorithm
from svtagg.deploy.tasks import task_spec
from svtagg.deploy.workloads import (
    forged_batch,
    laplace_argmax,
    model_selection,
    word_corpus,
    workload,
    zipf_categories,
)
from svtagg.dp.errors import Refusal
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import Identity, tls_target
from svtagg.proto.vocab import CALL_DEADLINE, CHANNEL_OPTIONS, Role

if TYPE_CHECKING:
    from svtagg.deploy.launch import LocalDeployment


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    a = sub.add_parser("analyst", help="administer tasks and run selection on a deployment")
    asub = a.add_subparsers(dest="analyst_command", metavar="ANALYST_COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--leader", required=True, help="leader host:port")
        p.add_argument("--certs", required=True, help="directory with ca.pem, analyst.pem/.key")
        p.add_argument("--task", required=True)

    c = asub.add_parser("create-task", help="create a task on both servers")
    common(c)
    c.add_argument(
        "--d",
        type=int,
        default=None,
        help="the task's dimension (required, except for a crawl task: --validity crawl:B "
        "has d = 1)",
    )
    c.add_argument("--n-max", type=int, default=1_000_000)
    c.add_argument("--min-batch", type=int, default=100)
    c.add_argument("--frac-bits", type=int, default=16)
    c.add_argument("--epsilon", default="10", help="total ε budget (exact, e.g. 1/2)")
    c.add_argument("--delta", default="1/1000000", help="total δ budget")
    c.add_argument(
        "--validity",
        default=None,
        metavar="CIRCUIT",
        help="every report proves its values valid at ingest (Prio3): range (values in "
        "[0,1]), onehot (one 1), multihot or multihot:r (0/1, at most r ones), or none "
        "(plain shares, which a default server refuses); sparse-onehot, sparse-multihot:r and "
        "sparse-range:r (at most r values in [0,1]): the same as verifiable DPF keys of "
        "O(log d) bytes each; crawl:B: each report is one string "
        "of B bits (B/8 bytes; d = 1), walked by `svtagg analyst crawl`; see "
        "docs/threat-model.md (default: multihot for --embedding heavy_hitters, crawl:64 for "
        "--embedding strings, else range; the choice is printed)",
    )
    c.add_argument(
        "--embedding",
        choices=EMBEDDINGS,
        default="",
        help="record the embedding the clients use (vectors: rows already in [0,1]^d; "
        "strings: one string per user, for a crawl:B task); uploads embedded otherwise are "
        "refused (default: none recorded)",
    )
    c.add_argument(
        "--noise",
        choices=("independent", "joint"),
        default="independent",
        help="joint: each stream's noise is drawn once, at the mechanism's scale, inside "
        "the garbled circuit from both servers' random bits (every stream kind; each "
        "stream also charges the sampler's δ, at most 2^-64, and ctt its own δ); see "
        "docs/privacy.md (default: independent, each server adds its own)",
    )
    c.add_argument(
        "--epsilon-min",
        default="auto",
        help="smallest ε a stream may use; auto: the smallest safe from overflow",
    )
    # create-task, describe and close are run by deploy/admin.py (one path for
    # the command line and the Python front door, --json included).
    for name, text in (
        ("describe", "show a task: n, state, both ledgers"),
        ("close", "close the collection on both servers"),
    ):
        common(asub.add_parser(name, help=text))
    r = asub.add_parser("run", help="run a selection algorithm through the servers")
    common(r)
    r.add_argument("--algorithm", choices=list(ALGORITHMS), default="top-k")
    r.add_argument("--epsilon", default="1")
    r.add_argument("--beta", type=float, default=0.05)
    r.add_argument("--k", type=int, default=None, help="top-k, sparse-mean: how many (default 10)")
    r.add_argument("--index", type=int, default=None, help="sum (required): which coordinate")
    r.add_argument(
        "--kind",
        default=None,
        help="stream kind: lap24 | lap3 | exp3, and auto for scan, top-k and fp (default: "
        "each algorithm's own — auto for those three, lap24 for the paper's algorithms)",
    )
    r.add_argument("--seed", type=int, default=None)
    r.add_argument(
        "--counts",
        default=None,
        metavar="EPS",
        help="top-k: also each selected item's count with an interval (Cor. 6.8's "
        "binary-search sum, EPS/k each), charged on top of --epsilon in the same plan",
    )
    r.add_argument(
        "--progress",
        action="store_true",
        help="a progress line on stderr every 2 s (always on a terminal)",
    )
    r.add_argument(
        "--shares",
        default=None,
        help="scan, top-k: ε shares of the localisation, SEARCH,MIDDLE (default 1/8,1/16; "
        "larger shares send fewer comparisons, leave less ε to decide: 1/2,0 is the cheap "
        "end, 1/16,1/32 the accurate one)",
    )
    r.add_argument("--p", type=float, default=2.0, help="fp: the loss exponent p")
    r.add_argument("--bound", type=float, default=1.0, help="fp: residual bound b")
    r.add_argument(
        "--clip",
        type=float,
        default=None,
        help="sparse-mean: the clip B the clients used (default: from n, d, β)",
    )
    r.add_argument(
        "--attributes",
        type=int,
        default=None,
        help="mwem: number of binary attributes (d must be their pair count)",
    )
    r.add_argument("--rounds", type=int, default=None, help="mwem: T (default: Theorem 7.7)")
    r.add_argument(
        "--delta",
        type=float,
        default=0.0,
        help="mwem: δ > 0 selects the advanced-composition version (Thm 7.8)",
    )
    r.set_defaults(handler=_run)
    a.set_defaults(handler=lambda _a: (a.print_help(), 2)[1])

    d = sub.add_parser(
        "demo",
        help="run the whole system on this machine: private model selection next to "
        "aggregation baselines (about 30 s on 2 cores)",
    )
    d.add_argument(
        "--scenario",
        choices=["model-selection", "heavy-hitters", "strings"],
        default="model-selection",
        help="model-selection (default): every user's record touches all d candidates "
        "(clipped losses), where SVT selection beats Gaussian aggregation and Laplace "
        "counts at the same ε; heavy-hitters: private top-k of Zipf categories; "
        "strings: the heavy words of a generated text by the prefix crawl over 64-bit "
        "strings, through a leader and a helper process",
    )
    d.add_argument("--users", type=int, default=10_000)
    d.add_argument("--d", type=int, default=1000)
    d.add_argument(
        "--k", type=int, default=None, help="how many heavy hitters (default 5; strings: 10)"
    )
    d.add_argument("--epsilon", default="4")
    d.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of categories")
    d.add_argument(
        "--per-user",
        type=int,
        default=1,
        help="heavy-hitters: categories drawn per user; 1 (default) uploads sparse "
        "reports (sparse-onehot: a verifiable DPF key of O(log d) bytes), N > 1 sparse "
        "sparse-multihot:N reports (N keys over the domain and 2N - 2 small ones)",
    )
    d.add_argument(
        "--malicious",
        type=int,
        default=0,
        metavar="M",
        help="heavy-hitters: M malicious clients besides the users, each sending its "
        "worst valid report (its items on the rarest categories) and a forged one "
        "(a count of 10^6 on the rarest category, made honestly for that count), "
        "which the servers refuse; strings: M forged reports of the latter kind",
    )
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--workdir", help="keep certificates, stores and logs here")
    d.set_defaults(handler=_demo)

    s = sub.add_parser("sim", help="multi-process simulation; writes a JSON report")
    s.add_argument("--workload", choices=["heavy_hitters", "uniform"], default="heavy_hitters")
    s.add_argument("--n", type=int, default=10_000)
    s.add_argument("--d", type=int, default=1000)
    s.add_argument("--algorithm", choices=list(ALGORITHMS), default="top-k")
    s.add_argument("--epsilon", default="4")
    s.add_argument("--k", type=int, default=None, help="top-k: how many (default 10)")
    s.add_argument("--beta", type=float, default=0.05)
    s.add_argument("--clients", type=int, default=2, help="uploader processes")
    s.add_argument("--batch", type=int, default=500)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--out", default="results/sim.json")
    s.add_argument("--workdir")
    s.add_argument(
        "--validity",
        default="",
        metavar="CIRCUIT",
        help="every report proves its values valid at ingest "
        "(range, onehot, sparse-onehot, multihot:r, sparse-multihot:r, sparse-range:r)",
    )
    s.set_defaults(handler=_sim)


# ------------------------------------------------------------------ helpers
def analyst_channel(leader: str, certs: str | Path) -> grpc.Channel:
    """A mutual-TLS channel to the leader at `leader`, as the analyst in `certs`."""
    ident = Identity.load(certs, "analyst")
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    options = [*CHANNEL_OPTIONS, *tls_target(Role.LEADER)]
    return grpc.secure_channel(leader, creds, options=options)


def analyst_stub(leader: str, certs: str | Path) -> Any:
    return pb_grpc.AnalystStub(analyst_channel(leader, certs))


#: Embeddings a task may record (`client/embeddings.py`; "vectors": none applied).
EMBEDDINGS = ["heavy_hitters", "sparse_mean", "marginals", "fp_loss", "vectors", "strings"]


def _oracle_summary(oracle: Any, before: Any = None) -> dict[str, Any]:
    """What the run cost, JSON-ready: stream and query counts, this run's spend
    (the task's ledger now minus `before`, the ledger when the run started), and
    the task's totals under `task_…`.  Budget figures are numbers, with the exact
    fractions as strings under "exact" (as `svtagg analyst budget --json`)."""
    st = oracle.stats()
    b = oracle.budget()
    eps0, delta0 = (before.epsilon_spent, before.delta_spent) if before else (0, 0)
    exact = {
        "epsilon_spent": b.epsilon_spent - eps0,
        "delta_spent": b.delta_spent - delta0,
        "task_epsilon_spent": b.epsilon_spent,
        "task_epsilon_left": b.epsilon_left,
        "task_delta_spent": b.delta_spent,
        "task_delta_left": b.delta_left,
    }
    return {
        "streams": st.streams,
        "queries": st.queries,
        "chunks": st.chunks,
        "peer_bytes": getattr(st, "peer_bytes", 0),
        **(
            {
                "noise_queries": st.noise_queries,
                "noise_drawn_in_chunks": st.noise_drawn,
                "noise_shapes": dict(st.noise_shapes),
            }
            if getattr(st, "noise_queries", 0)
            else {}
        ),
        **{key: float(value) for key, value in exact.items()},
        "exact": {key: str(value) for key, value in exact.items()},
    }


def _run(args: argparse.Namespace) -> int:
    from svtagg.analyst.remote_oracle import RemoteOracle

    start = time.perf_counter()

    def chunk_sent(done: int, chunks: int, candidates: int) -> None:
        # noisy-max over more than one chunk: a line per chunk, on stderr.
        if chunks > 1:
            _progress(
                f"  chunk {done}/{chunks} of the tournament sent ({candidates:,} candidates, "
                f"{time.perf_counter() - start:.1f}s)"
            )

    flags = RunFlags.from_args(args)
    with RemoteOracle.from_certs(args.leader, args.task, args.certs) as oracle:
        before = oracle.budget()
        progress = chunk_sent if flags.algorithm == "noisy-max" else None
        plans: list[str] = []
        with RunProgress(oracle, str(flags.epsilon), start, on=_show_progress(args)):
            try:
                result = run_algorithm(oracle, flags, progress=progress, on_plan=plans.append)
            except Exception as exc:
                if plans:
                    _failed_run(oracle, args.task, plans[0], str(flags.epsilon), exc)
                raise
        summary = _oracle_summary(oracle, before)
    asked = result.pop("epsilon")
    result["epsilon"] = float(Fraction(asked))
    result.update(summary)
    result["exact"] = {"epsilon": asked, **summary["exact"]}
    result["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(result, indent=2))
    return 0


def _show_progress(args: argparse.Namespace) -> bool:
    """Progress lines on stderr: on a terminal, or when asked (--progress)."""
    return bool(getattr(args, "progress", False)) or sys.stderr.isatty()


class RunProgress:
    """While a run works, a line on stderr every `every` seconds: streams,
    queries and chunks so far, the ε the run reserved, the time; a last line
    when it ends.  Off when `on` is false."""

    def __init__(
        self, oracle: Any, epsilon: str, start: float, *, on: bool, every: float = 2.0
    ) -> None:
        self.oracle, self.epsilon, self.start, self.on, self.every = (
            oracle,
            epsilon,
            start,
            on,
            every,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def line(self) -> str:
        st = self.oracle.stats()
        noise = ""
        if getattr(st, "noise_queries", 0):  # a joint-noise task
            noise = (
                f"; joint noise ready ahead for {st.noise_queries - st.noise_drawn:,} of "
                f"{st.noise_queries:,} queries sent ({st.noise_drawn:,} drawn in their "
                "chunks, at the sampler's pace)"
            )
        return (
            f"  {st.streams:,} streams, {st.queries:,} queries, {st.chunks:,} chunks; "
            f"ε {self.epsilon} reserved for this run; {time.perf_counter() - self.start:.1f}s"
            + noise
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            _progress(self.line())

    def __enter__(self) -> RunProgress:
        if self.on:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on:
            self._stop.set()
            self._thread.join()
            _progress(self.line().replace("  ", "  done: ", 1))


def _failed_run(oracle: Any, task_id: str, plan_id: str, epsilon: str, exc: Exception) -> None:
    """A run that failed after reserving its plan: end the plan if both servers
    answer (what its streams did not use comes back), and say what was spent
    and what stays reserved — a line on stderr and a JSON object on stdout."""
    report: dict[str, Any] = {
        "error": f"{type(exc).__name__}: {exc}",
        "plan_id": plan_id,
        "epsilon_reserved": epsilon,
    }
    try:
        if plan_id not in oracle.active_plans():
            return  # ended already: refused before any stream, nothing spent
        refunded, _ = oracle.end_plan(plan_id)
    except Exception as end_exc:  # noqa: BLE001 - the servers may still be out of reach
        report |= {"plan_state": "active", "epsilon_returned": "0"}
        _progress(
            f"the run failed after reserving ε {epsilon} (plan {plan_id}), which the task's "
            f"ledger counts as spent; the plan could not be ended now "
            f"({type(end_exc).__name__}). Once both servers answer, `svtagg analyst end-plan "
            f"--plan {plan_id}` returns what its streams did not use; `svtagg analyst plans "
            f"--task {task_id}` lists the plans still open"
        )
    else:
        report |= {"plan_state": "ended", "epsilon_returned": str(refunded)}
        _progress(
            f"the run failed; its plan {plan_id} is ended: ε {refunded} of the {epsilon} "
            "it reserved came back (the rest was used by the streams it opened)"
        )
    print(json.dumps(report, indent=2))


# ------------------------------------------------------------------ workloads
def _upload_slice(args: tuple[str, str, str, str, npt.NDArray[np.float64], int]) -> dict[str, Any]:
    from svtagg.client.upload import Uploader

    leader, helper, certs, task, values, batch = args
    c = Identity.load(certs, "client")
    with Uploader(leader, helper, c.ca, c.cert, c.key) as up:
        return asdict(up.upload(task, values, batch_size=batch))


def upload_parallel(
    leader: str,
    helper: str,
    certs: Path,
    task: str,
    values: npt.NDArray[np.float64],
    clients: int,
    batch: int,
) -> dict[str, Any]:
    """Upload from `clients` processes (one slice of users each); returns totals."""
    start = time.perf_counter()
    slices = np.array_split(values, max(clients, 1))
    jobs = [(leader, helper, str(certs), task, s, batch) for s in slices if len(s)]
    if clients <= 1:
        results = [_upload_slice(j) for j in jobs]
    else:
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            results = pool.map(_upload_slice, jobs)
    seconds = time.perf_counter() - start
    reports = sum(r["reports"] for r in results)
    return {
        "reports": reports,
        "retries": sum(r["retries"] for r in results),
        "seconds": round(seconds, 3),
        "reports_per_s": round(reports / seconds, 1),
    }


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ demo / sim
def _demo(args: argparse.Namespace) -> int:
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.deploy.launch import LocalDeployment

    t0 = time.perf_counter()
    if getattr(args, "k", 0) is None:
        args.k = 10 if getattr(args, "scenario", "") == "strings" else 5
    if getattr(args, "scenario", "heavy-hitters") == "model-selection":
        return _demo_model_selection(args, t0)
    if args.scenario == "strings":
        return _demo_strings(args, t0)
    per_user = getattr(args, "per_user", 1)
    _progress(
        f"simulating {args.users} users with Zipf({args.zipf}) categories over d={args.d} "
        f"({per_user} per user)"
    )
    values = heavy_hitters_embedding(
        zipf_categories(args.users, args.d, args.zipf, per_user, args.seed), args.d
    )
    truth = values.sum(axis=0)
    with LocalDeployment(Path(args.workdir) if args.workdir else None) as dep:
        up, info = _demo_collect(dep, args, values)
        _progress(f"running private top-{args.k} heavy hitters (ε={args.epsilon}) on the servers")
        t1 = time.perf_counter()
        with RemoteOracle.from_certs(dep.address("leader"), "demo", dep.certs) as oracle:

            def rank_done(rank: int, k: int, queries: int) -> None:
                _progress(
                    f"  rank {rank}/{k} selected ({queries:,} queries answered so far, "
                    f"{time.perf_counter() - t1:.1f}s)"
                )

            flags = RunFlags("top-k", args.epsilon, k=args.k, seed=args.seed)
            res = run_algorithm(oracle, flags, progress=rank_done)
            summary = _oracle_summary(oracle)
        query_s = time.perf_counter() - t1
    true_top = [int(j) for j in np.argsort(-truth, kind="stable")[: args.k]]
    print(
        "\n(count: the true count, which this demo knows because it made the data; the "
        "servers release only the selected ids — `analyst run --counts EPS` asks for "
        "private counts with intervals)"
    )
    print(f"{'rank':>4}  {'private top-k':>14} {'count':>7}   {'true top-k':>10} {'count':>7}")
    for r, (p, t) in enumerate(zip(res["selected"], true_top, strict=True), 1):
        print(f"{r:>4}  {p:>14} {int(truth[p]):>7}   {t:>10} {int(truth[t]):>7}")
    hits = len(set(res["selected"]) & set(true_top))
    print(
        f"\n{hits}/{args.k} of the true top-{args.k} found; "
        f"{summary['queries']} queries in {summary['streams']} streams "
        f"({summary['chunks']} chunks), {summary['peer_bytes'] / 1e6:.1f} MB between servers"
    )
    from svtagg.analyst.local_oracle import LocalOracle

    local = run_algorithm(
        LocalOracle(values, args.epsilon, parties=2),
        RunFlags("top-k", args.epsilon, k=args.k, seed=args.seed),
    )["selected"]
    print(
        f"(the local two-party reference oracle on the same data finds "
        f"{len(set(local) & set(true_top))}/{args.k}; selection accuracy is the algorithm's)"
    )
    print(
        f"budget: ε spent {summary['exact']['epsilon_spent']}, "
        f"left {summary['exact']['task_epsilon_left']}; "
        f"selection {query_s:.1f}s, wall time {time.perf_counter() - t0:.1f}s"
    )
    return 0


#: The strings demo: 64-bit strings (8 bytes), walked 8 bits a level, ≤ 32 kept
#: (8 levels at ε/8 each: at ε = 4 a τ of 97 users, where 16 levels of 4 bits
#: need 152 — the 10th word of 10⁴ users is held by ≈ 150).
STRINGS_BITS, STRINGS_STRIDE, STRINGS_KEPT = 64, 8, 32


def _demo_strings(args: argparse.Namespace, t0: float) -> int:
    """Heavy hitters over strings: each user holds one word of a generated
    text; a leader and a helper process (as `svtagg server` runs them) take
    the words as verifiable prefix-DPF keys (`crawl:64`), check each one's
    first level at ingest, and walk the prefixes level by level
    (`TaskHandle.heavy_strings`): every level's check on both servers, its
    bits from the garbled comparison, only the words above τ come back."""
    from collections import Counter
    from fractions import Fraction

    import svtagg
    from svtagg.analyst.crawl import false_positive_floor
    from svtagg.deploy.launch import LocalDeployment
    from svtagg.vdaf.crawl import PrefixDpf

    try:
        eps = Fraction(args.epsilon)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--epsilon must be a positive number, got {args.epsilon!r}") from None
    if eps <= 0:
        raise ValueError(f"--epsilon must be positive, got {args.epsilon}")
    if args.users < 1 or args.k < 1:
        raise ValueError(f"--users and --k must be at least 1, got {args.users} and {args.k}")
    words = word_corpus(args.users, max(4 * args.k, 500), args.zipf, args.seed)
    truth = Counter(words)
    levels = -(-STRINGS_BITS // STRINGS_STRIDE)
    tau = false_positive_floor(eps / levels, STRINGS_KEPT << STRINGS_STRIDE)
    malicious = getattr(args, "malicious", 0)
    _progress(
        f"simulating {args.users} users, one word each of a generated text "
        f"({len(truth)} distinct words, Zipf({args.zipf}))"
    )
    dpf = PrefixDpf(STRINGS_BITS)
    size = 16 + dpf.public_share_bytes() + 16
    with LocalDeployment(Path(args.workdir) if args.workdir else None) as dep:
        _progress(f"leader and helper started (work dir {dep.root})")
        leader, helper = dep.address("leader"), dep.address("helper")
        with svtagg.connect(leader, certs=dep.certs, helper=helper) as conn:
            task = conn.create_string_task(
                "demo",
                eps,
                bits=STRINGS_BITS,
                n_max=max(2 * (len(words) + malicious), 1000),
                min_batch=1,
            )
            t = time.perf_counter()
            task.upload_strings(words, journal=False)
            _progress(
                f"  {len(words):,} reports uploaded in {time.perf_counter() - t:.1f}s: a "
                f"verifiable prefix-DPF key pair each, {size:,} bytes to each server; both "
                "servers checked every report's first level"
            )
            if malicious:
                _forged_words(dep, dpf, min(truth, key=lambda w: (truth[w], w)), malicious)
            view = task.close_collection()
            rejected = dict(view.rejected) if getattr(view, "rejected", None) else {}
            _progress(
                f"collection closed: n = {view.n:,}"
                + (f"; refused at ingest: {rejected}" if rejected else "")
            )
            _progress(
                f"walking {levels} levels of {STRINGS_STRIDE} bits at ε/{levels} each "
                f"(ε={eps}), τ = {tau} (the plan's false-positive floor): each level a "
                "crawl stream charged on both ledgers"
            )
            t1 = time.perf_counter()

            def level_done(r: Any) -> None:
                _progress(
                    f"  level {r.level}/{levels}: {r.candidates:,} candidate prefixes, "
                    f"{r.kept} above τ ({time.perf_counter() - t1:.1f}s)"
                )

            res = task.heavy_strings(
                eps,
                stride=STRINGS_STRIDE,
                threshold=tau,
                max_kept=STRINGS_KEPT,
                progress=level_done,
            )
            walk_s = time.perf_counter() - t1
            stats = task.crawl_stats
            budget = task.budget()
    found = res.strings()
    top = [w for w, _ in truth.most_common(args.k)]
    print(
        "\n(count: the true count, which this demo knows because it made the text; "
        "the servers release only which prefixes are above τ)"
    )
    print(f"{'word found':>12} {'count':>7}    {'true top-' + str(args.k):>12} {'count':>7}")
    ranked = sorted(found, key=lambda w: -truth.get(w, 0))
    for i in range(max(len(ranked), len(top))):
        a = f"{ranked[i]:>12} {truth.get(ranked[i], 0):>7}" if i < len(ranked) else " " * 20
        b = f"{top[i]:>12} {truth[top[i]]:>7}" if i < len(top) else ""
        print(f"{a}    {b}")
    hits = len(set(top) & set(found))
    print(
        f"\n{hits}/{args.k} of the true top-{args.k} among the {len(found)} words found"
        + (f" ({res.stopped})" if res.stopped else "")
    )
    refused = stats.refused if stats is not None else 0
    peer = stats.peer_bytes if stats is not None else 0
    print(
        f"budget: ε spent {res.epsilon_spent} over {len(res.levels)} levels "
        f"(the leader's ledger: {budget.exact['epsilon_spent']} of "
        f"{budget.exact['epsilon_total']}); "
        f"reports refused by the walk's checks: {refused}; "
        f"{peer / 1e6:.1f} MB between the servers; "
        f"walk {walk_s:.1f}s, wall time {time.perf_counter() - t0:.1f}s"
    )
    return 0


def _forged_words(dep: Any, dpf: Any, word: str, count: int) -> None:
    """Upload `count` reports made honestly for a count of 10^6 on `word`
    (what a hostile client would send): the first level's check at ingest
    refuses them."""
    from svtagg.client.strings import encode_string
    from svtagg.client.upload import Batch, Uploader, UploadStats
    from svtagg.proto import svtagg_pb2 as pb
    from svtagg.proto.tls import Identity

    ident = Identity.load(dep.certs, "client")
    lead, help_ = pb.UploadBatch(task_id="demo"), pb.UploadBatch(task_id="demo")
    for _ in range(count):
        nonce = os.urandom(16)
        public, keys = dpf.gen(encode_string(word, STRINGS_BITS), nonce, os.urandom(32), 10**6)
        lead.reports.add(report_id=nonce, input_share=keys[0], public_share=public)
        help_.reports.add(report_id=nonce, input_share=keys[1], public_share=public)
    with Uploader(
        dep.address("leader"), dep.address("helper"), ident.ca, ident.cert, ident.key
    ) as up:
        stats = UploadStats()
        up.send(Batch(lead, help_, proofs=True), stats)
    _progress(
        f"  {count} forged reports (a count of 10^6 on {word!r}) uploaded: refused {stats.rejected}"
    )


def _demo_collect(
    dep: LocalDeployment, args: argparse.Namespace, values: np.ndarray, budget: str | None = None
) -> tuple[dict[str, Any], Any]:
    """The demo's task on the running deployment (total ε `budget`, default the
    run's ε): create it, upload `values`, close the collection; (upload figures,
    the close's TaskInfo)."""
    _progress(
        f"leader {dep.address('leader')}, helper {dep.address('helper')} "
        f"(separate processes, mutual TLS, SQLite in {dep.root})"
    )
    stub = analyst_stub(dep.address("leader"), dep.certs)
    # Heavy hitters: every report proves it holds at most 3 categories (0/1
    # entries), checked at ingest.  Model selection's dense [0,1]^1000 vectors
    # would need a range proof of (F+1)·d field elements per report (272 KB at
    # F = 16: docs/scaling.md), so that demo keeps plain shares and the robust
    # aggregates' bound.
    model = getattr(args, "scenario", "heavy-hitters") == "model-selection"
    per_user = getattr(args, "per_user", 1)
    validity = "" if model else "sparse-onehot" if per_user == 1 else f"sparse-multihot:{per_user}"
    if validity:
        _say_reports(validity, args.d)
    stub.CreateTask(
        task_spec(
            "demo",
            args.d,
            10 * args.users,
            budget or args.epsilon,
            min_batch=100,
            validity=validity,
        ),
        timeout=CALL_DEADLINE,
    )
    up = upload_parallel(
        dep.address("leader"), dep.address("helper"), dep.certs, "demo", values, 1, 500
    )
    _progress(
        f"uploaded {up['reports']} reports in {up['seconds']}s ({up['reports_per_s']:,.0f}/s)"
    )
    if getattr(args, "malicious", 0) and validity:
        _attack(dep, values, validity, args.malicious)
    info = stub.CloseCollection(pb.TaskRef(task_id="demo"), timeout=CALL_DEADLINE)
    checked = (
        f" (every report's {validity} proof checked at ingest; "
        f"{sum(info.rejected.values())} refused)"
        if validity
        else ""
    )
    _progress(f"collection closed: n={info.n} on both servers{checked}")
    return up, info


def _say_reports(validity: str, d: int) -> None:
    """What one report costs on the wire, for the circuit the demo uses."""
    from svtagg.vdaf.sparse import SparseMultihot
    from svtagg.vdaf.validity import parse_validity

    circuit, dense = parse_validity(validity, d, 16), parse_validity("onehot", d, 16)
    assert circuit is not None and dense is not None
    size = circuit.input_share_bytes(0) + circuit.public_share_bytes()
    scheme = circuit.scheme if circuit.sparse else None
    if isinstance(scheme, SparseMultihot) and circuit.multihot:
        dense = parse_validity(f"multihot:{circuit.max_weight}", d, 16)
        assert dense is not None
        _progress(
            f"reports: {validity}, each {scheme.count} verifiable DPF keys "
            f"({circuit.max_weight} over the domain), "
            f"{size:,} bytes to the leader (a dense multihot:{circuit.max_weight} report at "
            f"d={d} is {dense.input_share_bytes(0) + dense.public_share_bytes():,}); both "
            "servers expand every key and check at ingest that the items are distinct, "
            f"at most {circuit.max_weight}"
        )
    elif circuit.sparse:
        _progress(
            f"reports: sparse-onehot, each a verifiable DPF key of {size:,} bytes to the "
            f"leader (a dense onehot report at d={d} is "
            f"{dense.input_share_bytes(0) + dense.public_share_bytes():,}); both servers "
            "expand every key over the whole domain and check it is one-hot at ingest"
        )
    else:
        _progress(f"reports: {validity} with a Prio3 proof, {size:,} bytes each to the leader")


def _attack(dep: LocalDeployment, values: np.ndarray, validity: str, clients: int) -> None:
    """`clients` malicious clients: each sends its worst valid report and a
    forged one (see `--malicious`); the servers count the first like any user's
    and refuse the second."""
    from svtagg.client.upload import Uploader, UploadStats
    from svtagg.vdaf.validity import parse_validity

    d = values.shape[1]
    circuit = parse_validity(validity, d, 16)  # task_spec's default F
    assert circuit is not None
    rare = np.argsort(values.sum(axis=0), kind="stable")[
        : circuit.max_weight if circuit.multihot else 1
    ]
    worst = np.zeros((clients, d))
    worst[:, rare] = 1
    c = Identity.load(dep.certs, "client")
    with Uploader(dep.address("leader"), dep.address("helper"), c.ca, c.cert, c.key) as up:
        valid = up.upload("demo", worst)
        forged = forged_batch("demo", circuit, int(rare[0]), 10**6, clients)
        stats = UploadStats()
        up.send(forged, stats)
    refused = ", ".join(f"{k} {v}" for k, v in sorted(stats.rejected.items()))
    _progress(
        f"{clients} malicious clients: {valid.reports} worst valid reports counted "
        f"(one user's worth each, on categories {sorted(int(j) for j in rare)}); "
        f"{clients} forged reports refused ({refused or 'none refused!'})"
    )


#: One row of the model-selection demo's table: the method, its chosen
#: candidate, and — for a run through the servers — the bytes between the
#: servers and its wall time (None for a simulated baseline).
DemoRow = tuple[str, int, int | None, float | None]


def selection_table(truth: npt.NDArray[np.float64], rows: list[DemoRow]) -> list[str]:
    """The demo's table: chosen candidate, its score, the error (best score −
    chosen score), MB between the servers and seconds ('—' where not run on them).
    Scores are the truth the demo knows (it made the data), not released figures."""
    best = float(truth.max())
    out = [
        f"{'method':<60} {'chosen':>7} {'score':>9} {'error':>8} {'MB servers':>10} {'s':>6}",
    ]
    for name, j, peer_bytes, seconds in rows:
        mb = "—" if peer_bytes is None else f"{peer_bytes / 1e6:.2f}"
        sec = "—" if seconds is None else f"{seconds:.1f}"
        out.append(f"{name:<60} {j:>7} {truth[j]:>9.1f} {best - truth[j]:>8.1f} {mb:>10} {sec:>6}")
    out.append(
        "(score: the candidate's true score, known to the demo because it made the data; "
        "only the choice is released)"
    )
    return out


#: The scan's settings the demo also runs on a local oracle: (label, --shares,
#: noise).  "joint": a joint-noise task's law (one draw of the garbled sampler per
#: term, `LocalOracle(noise="joint")`), simulated, not run through the servers:
#: drawing each ν in the garbled sampler moves ≈ 40× the comparison's bytes.
LOCAL_SCANS: tuple[tuple[str, str | None, str], ...] = (
    ("SVT scan, default, local two-party oracle", None, "independent"),
    ("SVT scan, cheap end (ε/2 search, no middle), local two-party", "1/2,0", "independent"),
    ("SVT scan, accurate end (ε/16 + ε/32), local two-party", "1/16,1/32", "independent"),
    ("SVT scan, default, joint noise (local simulation)", None, "joint"),
)


def _local_scan_rows(values: np.ndarray, epsilon: str, seed: int | None) -> list[DemoRow]:
    """The scan at its three settings and with joint noise, on local oracles
    over the same data and ε (each at ε; a joint oracle has a task's epsilon_min
    and a δ budget for the sampler's δ)."""
    from svtagg.analyst.local_oracle import LocalOracle
    from svtagg.dp.task import safe_epsilon_min

    rows: list[DemoRow] = []
    for label, shares, noise in LOCAL_SCANS:
        joint = noise == "joint"
        oracle = LocalOracle(
            values,
            epsilon,
            "1/1000000" if joint else 0,
            parties=2,
            seed=seed,
            noise=noise,
            epsilon_min=safe_epsilon_min(10 * values.shape[0], 16) if joint else None,
        )
        res = run_algorithm(oracle, RunFlags("scan", epsilon, shares=shares))
        rows.append((label, int(res["selected"]), None, None))
    return rows


def _demo_model_selection(args: argparse.Namespace, t0: float) -> int:
    """Private model selection through both servers (the scan selection and
    report-noisy-max, each at ε on one task of 2ε), next to the aggregation
    baselines and the central exponential mechanism."""
    from svtagg.analyst import baselines
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.deploy.launch import LocalDeployment

    _progress(
        f"simulating {args.users} users scoring d={args.d} candidate models "
        "(value = 1 − clipped loss: every record touches every candidate)"
    )
    values = model_selection(args.users, args.d, args.seed)
    truth = values.sum(axis=0)
    eps = float(Fraction(args.epsilon))
    served: list[DemoRow] = []
    with LocalDeployment(Path(args.workdir) if args.workdir else None) as dep:
        up, info = _demo_collect(dep, args, values, budget=str(2 * Fraction(args.epsilon)))
        with RemoteOracle.from_certs(dep.address("leader"), "demo", dep.certs) as oracle:
            for algorithm, name in (
                ("scan", "SVT scan selection, two servers (pure ε)"),
                ("noisy-max", "report-noisy-max, two servers (pure ε)"),
            ):
                _progress(f"running private model selection ({algorithm}, ε={args.epsilon})")
                sent, t1 = oracle.stats().peer_bytes, time.perf_counter()
                res = run_algorithm(oracle, RunFlags(algorithm, args.epsilon, seed=args.seed))
                spent = time.perf_counter() - t1
                served.append((name, int(res["selected"]), oracle.stats().peer_bytes - sent, spent))
            summary = _oracle_summary(oracle)
    n = args.users
    rows: list[DemoRow] = [
        *served,
        (
            f"Gaussian aggregation, all d sums ((ε, 1/n²), ℓ2 sens. √{args.d})",
            baselines.gaussian_selection(truth, eps, 1.0 / n**2, args.seed),
            None,
            None,
        ),
        (
            f"Laplace on all d sums (pure ε, ℓ1 sens. {args.d})",
            laplace_argmax(truth, eps, float(args.d), args.seed),
            None,
            None,
        ),
        (
            "exponential mechanism (central, trusted curator)",
            baselines.exponential_mechanism(truth, eps, 1.0, args.seed),
            None,
            None,
        ),
    ]
    rows += _local_scan_rows(values, args.epsilon, args.seed)
    print(f"\nbest candidate {int(truth.argmax())}: score {truth.max():.1f} (n = {n}, ε = {eps:g})")
    print("\n".join(selection_table(truth, rows)))
    print(
        f"\nerror = best score − chosen score (a score unit is one user's full vote); "
        f"through the servers: {summary['queries']} queries in {summary['streams']} streams, "
        f"{summary['peer_bytes'] / 1e6:.1f} MB between servers; '—': not run on the servers"
    )
    print(
        f"budget: ε spent {summary['exact']['epsilon_spent']} (ε each for the two runs), "
        f"left {summary['exact']['task_epsilon_left']}; "
        f"wall time {time.perf_counter() - t0:.1f}s "
        "(--scenario heavy-hitters runs the top-k demo)"
    )
    return 0


def _sim(args: argparse.Namespace) -> int:
    from svtagg.analyst.remote_oracle import RemoteOracle
    from svtagg.deploy.launch import LocalDeployment

    t0 = time.perf_counter()
    values = workload(args.workload, args.n, args.d, args.seed)
    truth = values.sum(axis=0)
    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "handler"}}
    with LocalDeployment(Path(args.workdir) if args.workdir else None) as dep:
        stub = analyst_stub(dep.address("leader"), dep.certs)
        stub.CreateTask(
            task_spec(
                "sim",
                args.d,
                max(10 * args.n, 1000),
                args.epsilon,
                validity=args.validity,
            ),
            timeout=CALL_DEADLINE,
        )
        _progress(f"uploading {args.n} reports from {args.clients} client processes")
        report["upload"] = upload_parallel(
            dep.address("leader"),
            dep.address("helper"),
            dep.certs,
            "sim",
            values,
            args.clients,
            args.batch,
        )
        t_close = time.perf_counter()
        closed = stub.CloseCollection(pb.TaskRef(task_id="sim"), timeout=3600)
        report["close"] = {
            "seconds": round(time.perf_counter() - t_close, 3),
            "n": closed.n,
            "dropped_reports": closed.dropped_reports,
            "validity": args.validity or None,
            "rejected": dict(closed.rejected),
        }
        _progress(
            f"collection closed: n={closed.n}, dropped {closed.dropped_reports} "
            f"in {report['close']['seconds']}s"
        )
        _progress(f"running {args.algorithm}")
        t1 = time.perf_counter()
        with RemoteOracle.from_certs(dep.address("leader"), "sim", dep.certs) as oracle:
            try:
                flags = RunFlags(
                    args.algorithm,
                    args.epsilon,
                    args.beta,
                    args.k,
                    index=0 if args.algorithm == "sum" else None,
                    kind="lap24" if ALGORITHMS[args.algorithm].kinds else None,
                    seed=args.seed,
                )
                report["result"] = run_algorithm(oracle, flags)
            except (Refusal, ValueError) as exc:
                print(f"refused: {exc}", file=sys.stderr)
                return 1
            report["oracle"] = _oracle_summary(oracle)
        report["selection_seconds"] = round(time.perf_counter() - t1, 3)
    order = np.argsort(-truth, kind="stable")
    report["truth"] = {
        "top": [int(j) for j in order[: max(args.k, 1)]],
        "top_scores": [float(truth[j]) for j in order[: max(args.k, 1)]],
    }
    report["wall_seconds"] = round(time.perf_counter() - t0, 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _progress(f"wrote {out}")
    print(
        json.dumps(
            {k: report[k] for k in ("upload", "result", "oracle", "truth", "wall_seconds")},
            indent=2,
        )
    )
    return 0
