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
    spec = task_spec(
        args.task,
        args.d,
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
