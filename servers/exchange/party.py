"""One side of the two-party comparison protocol, as the servers use it: the
interface (`ComparisonParty`), how a server makes one for a session
(`PartyFactory`) and the real engine's factory (`garbled_circuit_party`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from svtagg.mpc.ring import U64
from svtagg.proto.terms import Role

if TYPE_CHECKING:
    from svtagg.mpc.channel import Channel


class ComparisonParty(Protocol):
    """One side of the two-party comparison protocol (svtagg.mpc.protocol)."""

    async def setup(self) -> None: ...

    async def first_yes(self, z: U64, width: int = 64) -> int | None: ...

    async def compare_to_thresholds(
        self, z_high: U64, z_low: U64, width: int = 64
    ) -> list[int]: ...

    async def noisy_max(
        self, z: U64, width: int = 64, carry: U64 | None = None, offset: int = 0
    ) -> int | None: ...

    async def noisy_max_carry(
        self, z: U64, carry: U64 | None, offset: int, width: int = 64
    ) -> U64: ...

    async def clamp_reshare(self, share: U64, bound: int) -> U64: ...

    async def field_clamp_reshare(self, share: U64, bound: int, field: object) -> U64: ...

    async def any_per_group(self, z: U64, group: int, width: int = 64) -> list[bool]: ...


PartyFactory = Callable[[Role, "Channel", bytes], ComparisonParty]


def garbled_circuit_party(role: Role, channel: Channel, session_id: bytes) -> ComparisonParty:
    """The real engine: the helper garbles, the leader evaluates.  The leader
    knows its inputs when the analyst's chunk arrives, so its OT-extension
    message travels with the chunk header; the helper answers with the tables,
    and the leader decodes the result the analyst waits for: one round trip
    (docs/mpc.md, "Per chunk")."""
    from svtagg.mpc.millionaire import server_path
    from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler
    from svtagg.mpc.softspoken import server_ot

    cls = ComparisonEvaluator if role == Role.LEADER else ComparisonGarbler
    party: ComparisonParty = cls(channel, session_id, ot=server_ot(), path=server_path())
    return party
