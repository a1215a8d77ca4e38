"""The joint-noise pool operations of `store.Store` (the rules are
`servers/store/jointpool.py`'s), written once for both stores: each store provides
`_sql` (a statement with `?` placeholders, run inside its transaction), `_tx`
and `stream`, and the tables `joint_pools` and `joint_batches` (SQLite schema
8, PostgreSQL schema 10)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from svtagg.dp.errors import FailedPrecondition
from svtagg.mpc.ring import U64
from svtagg.servers.store import jointpool
from svtagg.servers.store.jointpool import Batch, JointPool
from svtagg.servers.store.rules import IN_CHUNK, OPEN, StreamState


class JointPoolTables:
    """Mixed into `SqliteStore` and `PgStore`: every method commits before it
    returns (durably) or changes nothing and raises."""

    def _sql(self, statement: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def stream(self, stream_id: str) -> StreamState:
        raise NotImplementedError

    def begin_chunk(self, stream_id: str, chunk_no: int | None = None) -> int:
        raise NotImplementedError

    def _batches(self, stream_id: str, below: int) -> list[Batch]:
        """The held batches that start below `below`."""
        rows = self._sql(
            "SELECT lo, shares FROM joint_batches WHERE stream_id=? AND lo<? ORDER BY lo",
            (stream_id, below),
        )
        return [(int(lo), jointpool.decode(blob)) for lo, blob in rows]

    def joint_pool(self, stream_id: str) -> JointPool:
        row = self._sql(
            "SELECT next_seq, used_seq, gamma_ready FROM joint_pools WHERE stream_id=?",
            (stream_id,),
        ).fetchone()
        if row is None:
            return JointPool()
        sizes = self._sql(
            "SELECT lo, length(shares) / 8 FROM joint_batches WHERE stream_id=? ORDER BY lo",
            (stream_id,),
        ).fetchall()
        runs = jointpool.runs_of([(int(lo), int(n)) for lo, n in sizes])
        return JointPool(int(row[0]), int(row[1]), bool(row[2]), runs)

    def _set_pool(self, stream_id: str, pool: JointPool) -> None:
        self._sql(
            "INSERT INTO joint_pools (stream_id, next_seq, used_seq, gamma_ready)"
            " VALUES (?,?,?,?) ON CONFLICT (stream_id) DO UPDATE SET next_seq=excluded.next_seq,"
            " used_seq=excluded.used_seq, gamma_ready=excluded.gamma_ready",
            (stream_id, pool.next, pool.used, pool.gamma_ready),
        )

    def reserve_joint_batch(self, stream_id: str, count: int, lo: int | None = None) -> int:
        with self._tx():
            if self.stream(stream_id).state not in (OPEN, IN_CHUNK):
                raise FailedPrecondition(f"stream {stream_id!r} answers no more")
            pool = self.joint_pool(stream_id)
            first = jointpool.reserve(pool, count, lo)
            self._set_pool(stream_id, replace(pool, next=first + count))
        return first

    def add_joint_batch(self, stream_id: str, lo: int, nu: U64, gamma: int | None) -> bool:
        with self._tx():
            s = self.stream(stream_id)
            pool = self.joint_pool(stream_id)
            if s.state not in (OPEN, IN_CHUNK) or lo < pool.used or lo + len(nu) > pool.next:
                return False
            self._sql(
                "INSERT INTO joint_batches (stream_id, lo, shares) VALUES (?,?,?)",
                (stream_id, lo, jointpool.encode(nu)),
            )
            if gamma is not None and s.state == OPEN and s.chunks == 0:
                self._sql("UPDATE streams SET gamma=? WHERE stream_id=?", (str(gamma), stream_id))
                self._set_pool(stream_id, replace(pool, gamma_ready=True))
        return True

    def take_joint_noise(self, stream_id: str, lo: int, count: int) -> U64:
        with self._tx():
            if self.stream(stream_id).state != IN_CHUNK:
                raise FailedPrecondition(f"stream {stream_id!r} is not in a chunk")
            pool = self.joint_pool(stream_id)
            end = lo + count
            taken, keep = jointpool.take(self._batches(stream_id, end), pool.used, lo, count)
            self._sql("DELETE FROM joint_batches WHERE stream_id=? AND lo<?", (stream_id, end))
            for first, shares in keep:
                self._sql(
                    "INSERT INTO joint_batches (stream_id, lo, shares) VALUES (?,?,?)",
                    (stream_id, first, jointpool.encode(shares)),
                )
            self._set_pool(stream_id, replace(pool, used=end))
        return taken

    def begin_pooled_chunk(
        self, stream_id: str, chunk_no: int | None, lo: int, count: int
    ) -> tuple[int, U64]:
        with self._tx():
            number = self.begin_chunk(stream_id, chunk_no)
            return number, self.take_joint_noise(stream_id, lo, count)

    def discard_joint_pool(self, stream_id: str) -> None:
        with self._tx():
            self._sql("DELETE FROM joint_batches WHERE stream_id=?", (stream_id,))
