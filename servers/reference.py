"""The one-process reference: a leader driver and a helper driver on their own
stores, joined by the in-memory port (`servers.memory`).  No TLS, no sockets, no
subprocesses, so it runs in a notebook as well as in the tests::

    async with reference_pair(Path(tmp)) as ref:
        await ref.leader.create_task(spec)
        ref.upload(task_id, values)
        ...

Every leader↔helper message still passes through its serialised form; a `tap`
sees each one as bytes (`tests/test_transcript.py` freezes them)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from svtagg.dp.kinds import StreamKind
from svtagg.mpc.ring import encode
from svtagg.mpc.sharing import share
from svtagg.proto.vocab import REPORT_ID_BYTES, Role
from svtagg.servers.core import ServerCore
from svtagg.servers.exchange.party import PartyFactory, garbled_circuit_party
from svtagg.servers.exchange.values import OpenStream
from svtagg.servers.helper import HelperDriver
from svtagg.servers.ingest.batches import (
    Accepted,
    ProofReport,
    helper_receive,
    task_validity,
    verify_upload,
)
from svtagg.servers.leader import LeaderDriver
from svtagg.servers.memory import MemoryHelperPort, Tap
from svtagg.servers.store.rules import Store
from svtagg.servers.store.sqlite import SqliteStore


@dataclass
class ReferencePair:
    """The two drivers and the port between them."""

    leader: LeaderDriver
    helper: HelperDriver
    port: MemoryHelperPort
    frac_bits: int = 16
    #: Tests that inject helper failures keep their switch here.
    crash_helper: list[bool] = field(default_factory=lambda: [False])

    def store_reports(
        self,
        task_id: str,
        leader: Sequence[tuple[bytes, bytes]],
        helper: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Store one client upload: (report id, explicit share) on the leader,
        (report id, seed) on the helper (none: the helper misses it)."""
        self.leader.core.upload(task_id, leader)
        if helper:
            self.helper.core.upload(task_id, helper)

    def upload(self, task_id: str, values: npt.ArrayLike, leader_only: bool = False) -> None:
        """Encode rows of per-user values in [0, 1] and share each as a client
        does (fresh report ids and seeds), then store them."""
        rows = encode(np.atleast_2d(np.asarray(values, dtype=np.float64)), self.frac_bits)
        leader, helper = [], []
        for row in rows:
            rid, (explicit, seed) = os.urandom(REPORT_ID_BYTES), share(row)
            leader.append((rid, explicit.astype("<u8").tobytes()))
            helper.append((rid, seed))
        self.store_reports(task_id, leader, [] if leader_only else helper)

    async def upload_proofs(
        self, task_id: str, values: npt.ArrayLike, helper_too: bool = True
    ) -> Accepted:
        """Upload rows of per-user values as a client of a task with a validity
        circuit does: Prio3 reports, to the helper first (`helper_too`: else
        the helper misses them), then to the leader, which verifies the batch
        with the helper."""
        task = self.leader.core.task(task_id)
        grid = encode(np.atleast_2d(np.asarray(values, dtype=np.float64)), task.params.frac_bits)
        ids = [os.urandom(REPORT_ID_BYTES) for _ in range(len(grid))]
        shards = task_validity(task).shard(grid.tolist(), ids)
        return await self.send_proofs(task_id, ids, shards, helper_too)

    async def send_proofs(
        self,
        task_id: str,
        ids: Sequence[bytes],
        shards: Sequence[tuple[bytes, bytes, bytes]],
        helper_too: bool = True,
    ) -> Accepted:
        """Send sharded reports ((public, leader, helper) share bytes) as a client does."""
        if helper_too:
            helper_receive(
                self.helper.core,
                task_id,
                [ProofReport(r, h, p) for r, (p, _, h) in zip(ids, shards, strict=True)],
            )
        reports = [ProofReport(r, ld, p) for r, (p, ld, _) in zip(ids, shards, strict=True)]
        return await verify_upload(self.leader.core, self.port, task_id, reports)

    async def open(self, task_id: str, eps: str = "1") -> str:
        """Open a LAP24 stream of ε `eps`; returns its id."""
        req = OpenStream(task_id, StreamKind.LAP24, eps)
        return (await self.leader.open_stream(req)).stream_id


@contextlib.asynccontextmanager
async def reference_pair(
    root: Path,
    party: PartyFactory | None = None,
    *,
    frac_bits: int = 16,
    robust: bool = True,
    tap: Tap | None = None,
    verify_proofs: bool = True,
    stores: tuple[Store, Store] | None = None,
    helper_party: PartyFactory | None = None,
) -> AsyncIterator[ReferencePair]:
    """A leader driver and a helper driver on fresh SQLite stores under `root`,
    or on `stores` (leader's, helper's; closed at the end) — e.g. two
    PostgreSQL schemas (`robust`, `verify_proofs`: False only for the tests'
    negative controls).  `party` makes both servers' comparison parties, or
    the leader's only when `helper_party` is given (e.g. another scheme)."""
    party = party or garbled_circuit_party
    if stores is None:
        stores = SqliteStore(root / "l.sqlite"), SqliteStore(root / "h.sqlite")
    # The helper's core first: each draws its noise key as it is made, and the
    # frozen transcript (tests/test_transcript.py) fixes that order.
    helper_core, leader_core = (
        ServerCore(role, store, robust_aggregates=robust, verify_proofs=verify_proofs)
        for role, store in ((Role.HELPER, stores[1]), (Role.LEADER, stores[0]))
    )
    helper = HelperDriver(helper_core, helper_party or party)
    port = MemoryHelperPort(helper, tap)
    leader = LeaderDriver(leader_core, port, party)
    try:
        yield ReferencePair(leader, helper, port, frac_bits)
    finally:
        await leader.stop_noise_fills()
        await leader.pool.close()
        await port.close()
        for store in stores:
            store.close()
