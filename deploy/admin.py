"""Task administration with scriptable output: `svtagg analyst list | budget |
describe | close | create-task`, each with `--json`.

Budgets print as decimals (`ε 3.79 of 4 spent`); `--json` gives the decimals as
numbers and the servers' exact fractions as strings beside them.  The commands
go through the Python front door (`svtagg.deploy.connection`), so the CLI and Python
see the same values.
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any

from svtagg.dp.kinds import as_fraction


def number(text: str) -> float:
    """A float from a decimal ("0.5", "1e-6") or an exact fraction ("1/2")."""
    try:
        value = float(as_fraction(text, "value"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number (e.g. 0.5, 1e-6, 1/2)"
        ) from None
    return value


def exact(text: str) -> str:
    """Validate an exact budget figure (decimal or fraction) and keep its text."""
    try:
        value = as_fraction(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number (e.g. 0.5, 1e-6, 1/2)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return text


def probability(text: str) -> str:
    """An exact δ: a number in [0, 1) (decimal or fraction); keeps its text."""
    exact(text)
    if as_fraction(text, "value") >= 1:
        raise argparse.ArgumentTypeError(f"δ must be in [0, 1), got {text!r}")
    return text


def probability_number(text: str) -> float:
    """`probability` as a float, for options the algorithms take as floats."""
    return float(as_fraction(probability(text), "value"))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _common(p: argparse.ArgumentParser, task: bool = True) -> None:
    p.add_argument("--leader", required=True, help="leader host:port")
    p.add_argument("--certs", required=True, help="directory with ca.pem, analyst.pem/.key")
    if task:
        p.add_argument("--task", required=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    analyst = sub.choices.get("analyst")
    if analyst is None:
        return
    asub = next(a for a in analyst._actions if isinstance(a, argparse._SubParsersAction))
    lst = asub.add_parser("list", help="list the leader's tasks: n, state, budget")
    _common(lst, task=False)
    lst.set_defaults(handler=run_list)
    bud = asub.add_parser("budget", help="a task's budget on both servers (decimals)")
    _common(bud)
    bud.set_defaults(handler=run_budget)
    plans = asub.add_parser(
        "plans", help="a task's plans still active: the budget a failed run left reserved"
    )
    _common(plans)
    plans.set_defaults(handler=run_plans)
    end = asub.add_parser(
        "end-plan", help="end a plan on both servers; what its streams did not use comes back"
    )
    _common(end, task=False)
    end.add_argument("--plan", required=True, help="the plan id (`svtagg analyst plans`)")
    end.set_defaults(handler=run_end_plan)
    prep = asub.add_parser(
        "prepare-noise",
        help="a joint-noise task: make the noise of a run's queries ahead, while the servers "
        "are idle (also while the collection is open)",
    )
    _common(prep)
    prep.add_argument("--kind", default=None, help="the streams' kind: lap24 | lap3 | exp3")
    prep.add_argument("--epsilon", default=None, type=exact, help="the streams' ε (exact)")
    prep.add_argument(
        "--count", type=int, default=None, help="samples of that shape to hold (one per query)"
    )
    prep.add_argument(
        "--like",
        default=None,
        metavar="SUMMARY",
        help="instead: the JSON summary a previous `svtagg analyst run` printed (a file, - "
        "for stdin): each of its noise shapes, a quarter more than it sent",
    )
    prep.add_argument(
        "--wait", action="store_true", help="wait until it is made (progress on stderr)"
    )
    prep.set_defaults(handler=run_prepare_noise)
    crawl = asub.add_parser(
        "crawl",
        help="heavy hitters over strings (a crawl:B task): walk the strings' prefixes "
        "through the servers; prints the strings found",
        description="The prefix crawl through the servers: ⌈B/stride⌉ levels, each "
        "extending the prefixes kept so far by --stride bits and keeping those whose noisy "
        "count (each server's discrete Laplace noise) is at least --tau, at ε/levels each, "
        "charged on both servers' ledgers as each level runs. Prints one line per level on "
        "stderr, the strings found on stdout (one per line), then the ε spent and why the "
        "walk stopped early, if it did. The task's collection must be closed.",
    )
    _common(crawl)
    crawl.add_argument(
        "--epsilon",
        type=exact,
        help="the walk's ε, split evenly over its levels (required unless --resume)",
    )
    crawl.add_argument(
        "--resume",
        action="store_true",
        help="go on with this task's walk that failed midway (its plan as it was recorded "
        "under SVTAGG_STATE_DIR): from its last completed level, the failed level asked "
        "again and charged again",
    )
    crawl.add_argument(
        "--stride", type=positive_int, default=8, help="bits each level adds (1 to 8)"
    )
    crawl.add_argument(
        "--tau",
        type=positive_int,
        default=None,
        help="the count threshold τ (users); default: the plan's false-positive floor, the "
        "least τ at which a level of max-kept × 2^stride strings nobody holds expects at "
        "most 0.05 above it",
    )
    crawl.add_argument(
        "--max-kept",
        type=positive_int,
        default=64,
        help="the most prefixes a level may keep; more above τ ends the walk (raise --tau "
        "or --epsilon); max-kept × 2^stride is at most 65,536",
    )
    crawl.set_defaults(handler=run_crawl)
    cmds = _choices(analyst)
    for name, handler in (("describe", run_describe), ("close", run_close)):
        if name in cmds:
            cmds[name].add_argument("--json", action="store_true", help="print one JSON object")
            cmds[name].set_defaults(handler=handler)
    create = cmds.get("create-task")
    if create is not None:
        create.add_argument("--json", action="store_true", help="print one JSON object")
        for action in create._actions:
            if action.dest == "epsilon":
                action.type = exact
            elif action.dest == "delta":
                action.type = probability
            elif action.dest in ("d", "n_max", "min_batch", "frac_bits"):
                action.type = positive_int
        create.set_defaults(handler=run_create)
    run = cmds.get("run")
    if run is not None:
        for action in run._actions:
            if action.dest == "delta":  # the same number syntax as create-task's --delta
                action.type = probability_number
            elif action.dest == "epsilon":
                action.type = exact


def _deployment(args: argparse.Namespace) -> Any:
    from svtagg.deploy.connection import Deployment

    return Deployment(args.leader, args.certs)


def _emit(args: argparse.Namespace, data: Any, text: str) -> int:
    print(json.dumps(data) if args.json else text)
    return 0


def run_list(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        tasks = dep.tasks()
    if args.json:
        return _emit(args, {"tasks": [t.to_json() for t in tasks]}, "")
    if not tasks:
        print("no tasks")
        return 0
    width = max(4, *(len(t.task_id) for t in tasks))
    head = f"{'task':<{width}}  {'d':>7}  {'n':>9}  {'state':<10}  {'ε spent/total':>17}"
    print(f"{head}  δ spent/total")
    for t in tasks:
        b = t.budget
        eps = f"{_num(b.exact['epsilon_spent'])}/{_num(b.exact['epsilon_total'])}"
        dlt = f"{_num(b.exact['delta_spent'])}/{_num(b.exact['delta_total'])}"
        state = "collecting" if t.collecting else "closed"
        print(f"{t.task_id:<{width}}  {t.d:>7}  {t.n:>9}  {state:<10}  {eps:>17}  {dlt}")
    return 0


def _num(x: Fraction | float) -> str:
    from svtagg.deploy.connection import format_number

    return format_number(x)


def run_budget(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        state = dep.task(args.task).state()
    data = {
        "task": state.task_id,
        "leader": state.budget.to_json(),
        "helper": state.helper_budget.to_json() if state.helper_budget else None,
    }
    lines = [f"task {state.task_id}", f"  leader: {state.budget}"]
    b = state.budget
    lines.append(f"          ε left {_num(b.epsilon_left)}, δ left {_num(b.delta_left)}")
    if state.helper_budget is not None:
        lines.append(f"  helper: {state.helper_budget}")
    return _emit(args, data, "\n".join(lines))


def run_plans(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        plans = dep.task(args.task).plans()
    if not plans:
        text = f"task {args.task}: no active plan"
    else:
        lines = [f"task {args.task}: {len(plans)} active plan(s)"]
        for p in plans:
            lines.append(f"  {p['plan_id']}  ε {p['epsilon']}  δ {p['delta']}  ({p['rule']})")
        lines.append("end one with: svtagg analyst end-plan --plan ID")
        text = "\n".join(lines)
    return _emit(args, {"task": args.task, "plans": plans}, text)


def run_end_plan(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        p = dep.end_plan(args.plan)
    text = (
        f"plan {p['plan_id']} of task {p['task_id']}: {p['state']}; returned "
        f"ε {p['refunded_epsilon']}, δ {p['refunded_delta']} (of ε {p['epsilon']} reserved)"
    )
    return _emit(args, p, text)


def _noise_shapes(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(kind, ε, count) to prepare: from --kind/--epsilon/--count, or from a
    run summary's `noise_shapes` (each count a quarter more)."""
    from svtagg.dp.errors import InvalidArgument

    given = [x is not None for x in (args.kind, args.epsilon, args.count)]
    if args.like is None:
        if not all(given):
            raise InvalidArgument("prepare-noise needs --kind, --epsilon and --count (or --like)")
        if args.count < 0:
            raise InvalidArgument(f"--count must be >= 0, got {args.count}")
        return [(args.kind, args.epsilon, args.count)]
    if any(given):
        raise InvalidArgument(
            "--like takes the shapes from the summary: no --kind/--epsilon/--count"
        )
    try:
        text = sys.stdin.read() if args.like == "-" else open(args.like, encoding="utf-8").read()
        shapes = json.loads(text).get("noise_shapes")
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidArgument(f"--like {args.like}: not a readable run summary ({exc})") from None
    if not isinstance(shapes, dict) or not shapes:
        raise InvalidArgument(
            f"--like {args.like}: the summary has no noise_shapes (a run on a joint-noise task "
            "with Ask streams has them)"
        )
    out = []
    for shape, count in shapes.items():
        kind, _, eps = str(shape).partition(":")
        if not eps or not isinstance(count, int) or count < 0:
            raise InvalidArgument(f"--like {args.like}: not a noise shape: {shape!r}: {count!r}")
        out.append((kind, eps, -(-count * 5 // 4)))
    return out


def run_prepare_noise(args: argparse.Namespace) -> int:
    import time

    shapes = _noise_shapes(args)
    last = time.monotonic()
    result: dict[str, dict[str, int]] = {}
    with _deployment(args) as dep:
        task = dep.task(args.task)
        if args.like is not None:  # a summary's counts, at most the task's bound each
            cap = task.prepare_noise(*shapes[0][:2], 0).cap
            shapes = [(kind, eps, min(count, cap)) for kind, eps, count in shapes]
        for kind, eps, count in shapes:  # every request first: the leader makes them in turn
            result[f"{kind}:{eps}"] = {
                "asked": count,
                **task.prepare_noise(kind, eps, count).to_json(),
            }
        while args.wait:
            for kind, eps, count in shapes:
                result[f"{kind}:{eps}"] = {
                    "asked": count,
                    **task.prepare_noise(kind, eps, 0).to_json(),
                }
            pending = sum(s["pending"] for s in result.values())
            if not pending:
                break
            now = time.monotonic()
            if now - last >= 2.0:
                last = now
                held = sum(s["held"] for s in result.values())
                print(
                    f"prepare-noise: {held:,} held, {pending:,} to make over {len(shapes)} "
                    "shape(s) (the sampler runs while no chunk does)",
                    file=sys.stderr,
                )
            time.sleep(1.0)
    lines = [f"task {args.task}: joint noise prepared ahead"]
    for name, s in result.items():
        short = (
            ""
            if s["held"] + s["pending"] >= s["asked"]
            else " (the task's bound or a failed batch: less)"
        )
        lines.append(
            f"  {name}: {s['held']:,} held of {s['asked']:,} asked, {s['pending']:,} to make{short}"
        )
    held = max(s["task_held"] for s in result.values())
    cap = max(s["cap"] for s in result.values())
    lines.append(f"  the task holds {held:,} samples of at most {cap:,}")
    return _emit(args, {"task": args.task, "shapes": result}, "\n".join(lines))


def run_describe(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        state = dep.task(args.task).state()
    return _emit(args, state.to_json(), str(state))


def run_close(args: argparse.Namespace) -> int:
    with _deployment(args) as dep:
        state = dep.task(args.task).close_collection()
    return _emit(args, state.to_json(), str(state))


def run_create(args: argparse.Namespace) -> int:
    from svtagg.deploy.jobs import task_spec
    from svtagg.deploy.tasks import default_validity
    from svtagg.dp.errors import InvalidArgument

    validity, chosen = args.validity, ""
    if validity is None:
        validity, why = default_validity(args.embedding)
        chosen = (
            f"create-task: --validity {validity} ({why}; every report proves it at ingest, "
            "as a default server requires; --validity none takes plain shares)"
        )
    elif validity == "none":
        validity = ""
    d = args.d
    if d is None:
        if not validity.startswith("crawl:"):
            raise ValueError(
                "create-task needs --d, the task's dimension (only a crawl task, "
                "--validity crawl:B, has d = 1 without it)"
            )
        d = 1
    spec = task_spec(
        args.task,
        d,
        args.n_max,
        args.epsilon,
        frac_bits=args.frac_bits,
        min_batch=args.min_batch,
        delta=args.delta,
        epsilon_min=args.epsilon_min,
        embedding=args.embedding,
        validity=validity,
        noise=args.noise,
    )
    with _deployment(args) as dep:
        try:
            dep._call("CreateTask", spec)
        except InvalidArgument as exc:
            detail = str(exc)
            if "epsilon" in detail or "delta" in detail:
                detail += (
                    f" (asked: ε {args.epsilon}, δ {args.delta}; "
                    "--help shows the defaults of --epsilon and --delta)"
                )
            raise InvalidArgument(detail) from None
        state = dep.task(args.task).state()
    if chosen:  # said once the task exists (a refusal stays one line)
        print(chosen, file=sys.stderr)
    return _emit(args, state.to_json(), str(state))


def _shown(s: str) -> str:
    """A found string as one line of output (escaped if it holds a control character)."""
    return s if s.isprintable() else repr(s)


def run_crawl(args: argparse.Namespace) -> int:
    """`svtagg analyst crawl`: `TaskHandle.heavy_strings` with a line per level."""
    import time

    from svtagg.deploy.connection import crawl_plan, walk_journal_path
    from svtagg.dp.errors import InvalidArgument

    start = time.perf_counter()
    if args.resume == (args.epsilon is not None):
        raise ValueError(
            "give --epsilon for a new walk, or --resume (and no plan) for the last one"
        )
    with _deployment(args) as dep:
        task = dep.task(args.task)
        view = task.state()
        journal = walk_journal_path(args.task, dep._ca)
        try:  # a bad invocation (exit 2), before anything is spent
            bits = task.crawl_bits(view)
            if args.resume:
                if not journal.is_file():
                    raise InvalidArgument(
                        f"no unfinished walk of task {args.task!r} is recorded here ({journal})"
                    )
                plan = task.restore_walk(json.loads(journal.read_text()))
            else:
                plan = crawl_plan(bits, args.epsilon, args.stride, args.tau, args.max_kept)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
        floor = " (the plan's false-positive floor)" if args.tau is None and not args.resume else ""
        print(
            f"crawl of task {args.task} (strings of {bits} bits): {plan.levels} levels of "
            f"{plan.stride} bits at ε {plan.level_epsilon} each (ε {plan.epsilon}), "
            f"τ = {plan.threshold}{floor}, at most {plan.max_kept} kept per level",
            file=sys.stderr,
            flush=True,
        )

        def level_done(r: Any) -> None:
            print(
                f"  level {r.level}/{plan.levels}: {r.prefix_bits} prefix bits, "
                f"{r.candidates:,} candidates, {r.kept:,} kept "
                f"({time.perf_counter() - start:.1f}s)",
                file=sys.stderr,
                flush=True,
            )

        try:
            result = task.heavy_strings(
                plan.epsilon,
                stride=plan.stride,
                threshold=plan.threshold,
                max_kept=plan.max_kept,
                progress=level_done,
                resume=args.resume,
            )
        except Exception:
            st = task.crawl_stats
            record = task.walk_record()
            if st is not None and st.levels:
                print(
                    f"the walk failed after {st.levels} level(s), which spent ε "
                    f"{st.epsilon_spent} on both servers' ledgers",
                    file=sys.stderr,
                )
            if record is not None and record["levels"]:
                journal.parent.mkdir(parents=True, exist_ok=True)
                journal.write_text(json.dumps(record))
                print(
                    f"its levels are recorded in {journal}: go on with it by "
                    f"`svtagg analyst crawl --task {args.task} --resume`",
                    file=sys.stderr,
                )
            raise
        journal.unlink(missing_ok=True)  # this task's walk ended
        stats = task.crawl_stats
        left = task.budget().exact
    assert stats is not None
    whole = bits % 8 == 0
    found = [_shown(s) for s in result.strings()] if whole else []
    width = (bits + 3) // 4
    values = [f"{x:0{width}x}" for x in result.found]
    task_left = left["epsilon_total"] - left["epsilon_spent"]
    data = {
        "task": args.task,
        "bits": bits,
        "stride": plan.stride,
        "tau": plan.threshold,
        "max_kept": plan.max_kept,
        "found": result.strings() if whole else None,
        "values": values,
        "levels": [
            {
                "level": r.level,
                "prefix_bits": r.prefix_bits,
                "candidates": r.candidates,
                "kept": r.kept,
                "refused": stats.refused_at.get(r.level, 0),
            }
            for r in result.levels
        ],
        "stopped": result.stopped or None,
        "epsilon": float(plan.epsilon),
        "epsilon_spent": float(result.epsilon_spent),
        "task_epsilon_left": float(task_left),
        "refused": stats.refused,
        "peer_bytes": stats.peer_bytes,
        "seconds": round(time.perf_counter() - start, 3),
        "exact": {
            "epsilon": str(plan.epsilon),
            "level_epsilon": str(plan.level_epsilon),
            "epsilon_spent": str(result.epsilon_spent),
            "task_epsilon_left": str(task_left),
        },
    }
    if args.json:
        print(json.dumps(data))
        return 0
    for line in found if whole else values:
        print(line)
    stopped = f"; stopped early: {result.stopped}" if result.stopped else ""
    print(
        f"{len(result.found)} string(s) found; ε {_num(result.epsilon_spent)} spent of the "
        f"walk's {_num(plan.epsilon)} over {len(result.levels)} of {plan.levels} levels "
        f"(ε {_num(task_left)} left on the task){stopped}; {stats.refused} reports refused by "
        f"the levels' checks, {stats.peer_bytes / 1e6:.1f} MB between the servers, "
        f"{time.perf_counter() - start:.1f}s",
        file=sys.stderr,
    )
    return 0
