"""The garbling scheme a server runs its comparison sessions under
(`--garbling`, docs/mpc.md "Three-halves garbling").

Both servers must garble and evaluate under the same scheme: the leader names
its scheme in SessionOpen and the helper refuses a session under another one
before any OT runs (`check_garbling`), with an error naming both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from svtagg.dp.errors import InvalidArgument
from svtagg.proto.vocab import Role

if TYPE_CHECKING:
    from svtagg.mpc.channel import Channel
    from svtagg.servers.exchange.party import ComparisonParty, PartyFactory

#: The schemes of `svtagg.mpc.threehalves.SCHEMES` (not imported: the engine
#: loads only when a session starts).
GARBLING_SCHEMES = ("halfgates", "threehalves")
#: Chosen from the servers' measured throughput (docs/mpc.md, docs/scaling.md).
DEFAULT_GARBLING = "halfgates"


def check_scheme_name(garbling: str) -> str:
    if garbling not in GARBLING_SCHEMES:
        raise ValueError(
            f"unknown garbling scheme {garbling!r}; choose {' or '.join(GARBLING_SCHEMES)}"
        )
    return garbling


class GarbledCircuitParties:
    """A `PartyFactory`: the real engine (the helper garbles, the leader
    evaluates) under one garbling scheme and one OT extension (`ot`: None is
    `SVTAGG_OT` or the default, `mpc.softspoken.server_ot`)."""

    def __init__(
        self,
        garbling: str = DEFAULT_GARBLING,
        ot: str | None = None,
        comparison: str | None = None,
    ) -> None:
        from svtagg.mpc.millionaire import server_path
        from svtagg.mpc.softspoken import parse_ot, server_ot

        self.garbling = check_scheme_name(garbling)
        self.ot = ot if ot is not None else server_ot()
        parse_ot(self.ot)  # ValueError (one line) for an unknown extension
        #: The path rule (None: `SVTAGG_COMPARISON`, else garbled).
        self.comparison = check_comparison(comparison if comparison is not None else server_path())

    def with_path(self, comparison: str) -> GarbledCircuitParties:
        """The same engine running another path rule (the helper takes the leader's)."""
        return GarbledCircuitParties(self.garbling, self.ot, comparison)

    def __call__(self, role: Role, channel: Channel, session_id: bytes) -> ComparisonParty:
        from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler

        cls = ComparisonEvaluator if role == Role.LEADER else ComparisonGarbler
        party: ComparisonParty = cls(
            channel, session_id, scheme=self.garbling, ot=self.ot, path=self.comparison
        )
        return party


def check_comparison(comparison: str) -> str:
    """The comparison path rule in its canonical spelling (`--comparison`:
    garbled, ot or auto:RTT_MS:MBPS), or ValueError naming the choices."""
    from svtagg.mpc.millionaire import PathRule

    return str(PathRule.parse(comparison))


def comparison_of(factory: PartyFactory) -> str:
    """The path rule a party factory runs (`server_path()` for any other engine)."""
    from svtagg.mpc.millionaire import server_path

    return str(getattr(factory, "comparison", None) or check_comparison(server_path()))


def helper_factory(factory: PartyFactory, announced: str) -> PartyFactory:
    """The helper's factory for a session whose leader announced `announced`:
    its own engine under the leader's rule (both must take the same path on
    every chunk), or InvalidArgument if the rule is malformed or the engine
    runs only the garbled path."""
    try:
        rule = check_comparison(announced)
    except ValueError as exc:
        raise InvalidArgument(f"the leader's comparison path: {exc}") from None
    if rule == comparison_of(factory):
        return factory
    with_path = getattr(factory, "with_path", None)
    if with_path is None:
        raise InvalidArgument(f"this helper's engine cannot run the comparison path {rule!r}")
    made: PartyFactory = with_path(rule)
    return made


def garbling_of(factory: PartyFactory) -> str:
    """The scheme a party factory garbles under (the default for any other engine)."""
    return str(getattr(factory, "garbling", DEFAULT_GARBLING))


def ot_of(factory: PartyFactory) -> str:
    """The OT extension a party factory runs (`server_ot()` for any other engine)."""
    from svtagg.mpc.softspoken import server_ot

    return str(getattr(factory, "ot", None) or server_ot())


def check_garbling(announced: str, own: str) -> None:
    """The helper's check of the leader's SessionOpen: the same scheme, or an
    InvalidArgument naming both (an empty announcement: a leader that does not
    name one, taken as the default)."""
    theirs = announced or DEFAULT_GARBLING
    if theirs != own:
        raise InvalidArgument(
            f"the leader's garbling scheme {theirs!r} is not this helper's {own!r} "
            "(start both servers with the same --garbling)"
        )
