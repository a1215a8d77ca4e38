"""Budget plans: what an algorithm will spend, declared before it touches data.

A plan is a list of groups (ε_g, δ_g) and a slack δ'.  Each stream the algorithm
opens names its group, and the streams of a group may together spend at most
(ε_g, δ_g) (basic composition inside the group).  The plan is charged once, at
reservation, by the cheapest of three composition rules over its groups, each
computed conservatively (rounded up, never down):

- basic: (Σ ε_g, Σ δ_g), exact;
- advanced (Dwork–Rothblum–Vadhan), k groups each (ε_max, δ_max)-DP:
  (√(2k ln(1/δ')) ε_max + k ε_max (e^ε_max − 1), k δ_max + δ');
- zCDP (Bun–Steinke), pure groups only: an ε_g-DP group is ε_g²/2-zCDP, so the
  plan is ρ = Σ ε_g²/2 and (ρ + 2√(ρ ln(1/δ')), δ')-DP.

Both servers compute the charge with this one function and check it against
their own ledger.  Plans whose charge is not basic are never refunded; a basic
plan returns what its streams did not spend when it ends (basic composition is
a valid privacy filter for adaptively chosen stream budgets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from svtagg.dp.errors import InvalidArgument
from svtagg.dp.kinds import as_fraction

#: Groups a plan may hold (MWEM with T rounds uses 2T).
MAX_PLAN_GROUPS = 10_000
#: Relative margin over the float evaluation of sqrt/log/expm1 (each within a few
#: ulps), before rounding up to a rational: the charge is never below the bound.
_MARGIN = Fraction(1, 10**9)


class Rule(StrEnum):
    BASIC = "basic"
    ADVANCED = "advanced"
    ZCDP = "zcdp"


@dataclass(frozen=True)
class Group:
    epsilon: Fraction
    delta: Fraction = Fraction(0)


@dataclass(frozen=True)
class PlanCharge:
    """What reserving the plan charges to the ledger, and by which rule."""

    epsilon: Fraction
    delta: Fraction
    rule: Rule


def parse_groups(groups: Sequence[tuple[object, object]]) -> list[Group]:
    """Validated groups from (ε, δ) pairs (numbers or exact strings)."""
    if not 1 <= len(groups) <= MAX_PLAN_GROUPS:
        raise InvalidArgument(f"a plan holds 1..{MAX_PLAN_GROUPS} groups, got {len(groups)}")
    out = []
    for e, d in groups:
        try:
            eps = as_fraction(e, "epsilon")  # type: ignore[arg-type]
            dl = as_fraction(d or 0, "delta")  # type: ignore[arg-type]
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if eps <= 0 or not 0 <= dl < 1:
            raise InvalidArgument(f"a plan group needs ε > 0 and 0 ≤ δ < 1, got ({eps}, {dl})")
        out.append(Group(eps, dl))
    return out


def check_groups_usable(groups: Sequence[Group], epsilon_min: Fraction) -> None:
    """Refuse a plan with a group below the task's smallest stream ε: no stream
    could open there, so reserving it would charge for nothing.  A server checks
    this before it reserves, so such a plan costs nothing."""
    for i, g in enumerate(groups):
        if g.epsilon < epsilon_min:
            raise InvalidArgument(
                f"plan group {i} holds epsilon={g.epsilon}, below the task's "
                f"epsilon_min={epsilon_min}: no stream could open in it"
            )


def _up(x: float) -> Fraction:
    """A rational ≥ x (with the float-evaluation margin)."""
    if not math.isfinite(x):
        raise InvalidArgument("plan charge is not finite")
    f = Fraction(math.nextafter(x, math.inf)) * (1 + _MARGIN)
    g = f.limit_denominator(10**12)
    return g if g >= f else g + Fraction(1, 10**12)


def plan_charge(groups: Sequence[Group], delta_slack: Fraction = Fraction(0)) -> PlanCharge:
    """The cheapest valid charge of the plan (smallest ε; ties go to basic)."""
    if not 0 <= delta_slack < 1:
        raise InvalidArgument(f"the plan's slack δ' must be in [0, 1), got {delta_slack}")
    basic = PlanCharge(
        sum((g.epsilon for g in groups), Fraction(0)),
        sum((g.delta for g in groups), Fraction(0)),
        Rule.BASIC,
    )
    best = basic
    if delta_slack > 0:
        k = len(groups)
        lg = math.log(1 / float(delta_slack))
        e_max = max(g.epsilon for g in groups)
        d_max = max(g.delta for g in groups)
        em = float(e_max)
        adv = _up(math.sqrt(2 * k * lg) * em + k * em * math.expm1(em))
        cands = [PlanCharge(adv, k * d_max + delta_slack, Rule.ADVANCED)]
        if d_max == 0:
            rho = float(sum((g.epsilon**2 for g in groups), Fraction(0)) / 2)
            cands.append(PlanCharge(_up(rho + 2 * math.sqrt(rho * lg)), delta_slack, Rule.ZCDP))
        for c in cands:
            if c.epsilon < best.epsilon:
                best = c
    return best


@dataclass
class PlanBook:
    """One reserved plan's running state: what each group's streams have spent."""

    groups: list[Group]
    charge: PlanCharge
    spent: list[tuple[Fraction, Fraction]]
    slack: Fraction = Fraction(0)

    @classmethod
    def reserve(cls, groups: Sequence[Group], delta_slack: Fraction = Fraction(0)) -> PlanBook:
        charge = plan_charge(groups, delta_slack)
        return cls(list(groups), charge, [(Fraction(0), Fraction(0))] * len(groups), delta_slack)

    def admit(self, group: int, epsilon: Fraction, delta_charge: Fraction) -> None:
        """Count a stream of (ε, δ charge) against `group`, or refuse it."""
        if not 0 <= group < len(self.groups):
            raise InvalidArgument(f"plan group {group} out of [0, {len(self.groups)})")
        g, (se, sd) = self.groups[group], self.spent[group]
        if se + epsilon > g.epsilon or sd + delta_charge > g.delta:
            raise InvalidArgument(
                f"plan group {group} holds (ε={g.epsilon}, δ={g.delta}); it has spent "
                f"(ε={se}, δ={sd}) and the stream asks (ε={epsilon}, δ={delta_charge})"
            )
        self.spent[group] = (se + epsilon, sd + delta_charge)

    def refund(self) -> tuple[Fraction, Fraction]:
        """What ending the plan returns: under basic composition what its streams
        did not spend (the sum over groups of what each spent is the true basic
        charge); under the other rules nothing."""
        if self.charge.rule != Rule.BASIC:
            return Fraction(0), Fraction(0)
        used_e = sum((e for e, _ in self.spent), Fraction(0))
        used_d = sum((d for _, d in self.spent), Fraction(0))
        return self.charge.epsilon - used_e, self.charge.delta - used_d

    def to_json(self) -> dict[str, object]:
        return {
            "groups": [[str(g.epsilon), str(g.delta)] for g in self.groups],
            "charge": [str(self.charge.epsilon), str(self.charge.delta), self.charge.rule.value],
            "spent": [[str(e), str(d)] for e, d in self.spent],
            "slack": str(self.slack),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> PlanBook:
        groups = [Group(Fraction(e), Fraction(d)) for e, d in data["groups"]]  # type: ignore[attr-defined]
        charge: list[str] = data["charge"]  # type: ignore[assignment]
        spent = [(Fraction(e), Fraction(d)) for e, d in data["spent"]]  # type: ignore[attr-defined]
        rule = Rule(charge[2])
        plan_charge_ = PlanCharge(Fraction(charge[0]), Fraction(charge[1]), rule)
        return cls(groups, plan_charge_, spent, Fraction(str(data.get("slack", "0"))))
