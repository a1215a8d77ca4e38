"""The PostgreSQL store's part of ingest verification (a mixin of
`store_pg.PgStore`): the helper's pending Prio3 shares and each verified
batch's verdicts (`store.Store.add_pending`, `pending`, `verdicts`)."""

from __future__ import annotations

from typing import Any, Protocol

from svtagg.dp.errors import AlreadyExists, FailedPrecondition
from svtagg.servers.store.rules import TaskState, Verified, check_pending_cap


class _Held(Protocol):
    """What the mixin uses of the store it is mixed into."""

    _conn: Any

    def _tx(self, durable: bool = True) -> Any: ...

    def task(self, task_id: str) -> TaskState: ...


class PgPending:
    """Pending shares and batch verdicts, in the tables of schema version 6 (the binding: 11)."""

    def _record_verified(self: _Held, task_id: str, v: Verified) -> None:
        """A verified batch's verdicts, and its pending shares dropped (inside
        the caller's transaction)."""
        if v.batch_id:  # the helper's record (a retried verification reads it)
            self._conn.execute(
                "INSERT INTO verdicts (task_id, batch_id, verdicts, binding)"
                " VALUES (%s, %s, %s, %s)",
                (task_id, v.batch_id, v.verdicts, v.binding),
            )
        self._conn.execute(
            "DELETE FROM pending WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, v.batch_ids),
        )

    def add_pending(
        self: _Held,
        task_id: str,
        report_ids: list[bytes],
        blobs: list[bytes],
        cap: int | None = None,
    ) -> int:
        with self._tx():
            row = self._conn.execute(
                "SELECT collection_open FROM tasks WHERE task_id=%s FOR UPDATE", (task_id,)
            ).fetchone()
            if row is None:
                self.task(task_id)  # NotFound
            if not row[0]:
                raise FailedPrecondition(f"collection of task {task_id!r} is closed")
            if cap is not None:  # the task's row is locked: no other batch counts meanwhile
                held = self._conn.execute(
                    "SELECT COUNT(*) FROM pending WHERE task_id=%s", (task_id,)
                ).fetchone()[0]
                check_pending_cap(held, len(report_ids), cap)
            seen = self._conn.execute(
                "SELECT COUNT(*) FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
                (task_id, report_ids),
            ).fetchone()[0]
            if seen:
                raise AlreadyExists(
                    f"{seen} report id(s) of this batch were already verified (replay); "
                    "batch refused"
                )
            with self._conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO pending (task_id, report_id, blob) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    [(task_id, rid, blob) for rid, blob in zip(report_ids, blobs, strict=True)],
                )
            count = self._conn.execute(
                "SELECT COUNT(*) FROM pending WHERE task_id=%s", (task_id,)
            ).fetchone()[0]
        return int(count)

    def pending(self: _Held, task_id: str, report_ids: list[bytes]) -> list[bytes | None]:
        rows = self._conn.execute(
            "SELECT report_id, blob FROM pending WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, report_ids),
        ).fetchall()
        held = {bytes(r[0]): bytes(r[1]) for r in rows}
        return [held.get(rid) for rid in report_ids]

    def verdicts(self: _Held, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._conn.execute(
            "SELECT verdicts FROM verdicts WHERE task_id=%s AND batch_id=%s", (task_id, batch_id)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def counted(self: _Held, task_id: str, report_ids: list[bytes]) -> int:
        row = self._conn.execute(
            "SELECT COUNT(*) FROM reports WHERE task_id=%s AND report_id = ANY(%s)",
            (task_id, report_ids),
        ).fetchone()
        return int(row[0])

    def verdict_binding(self: _Held, task_id: str, batch_id: bytes) -> bytes | None:
        row = self._conn.execute(
            "SELECT binding FROM verdicts WHERE task_id=%s AND batch_id=%s", (task_id, batch_id)
        ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])
