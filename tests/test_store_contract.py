"""The store contract, run against both backends: SQLite (always) and
PostgreSQL (a real server named by SVTAGG_TEST_POSTGRES, e.g. the one
`scripts/start_postgres.sh` starts; each test gets a fresh schema).  Without a
reachable server the PostgreSQL cases skip, saying why."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PG_ENV, postgres_unavailable

from svtagg.dp.errors import (
    AlreadyExists,
    BudgetExhausted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import Group, PlanBook
from svtagg.dp.task import TaskParams
from svtagg.servers.store.opener import open_store, sqlite_file
from svtagg.servers.store.rules import (
    CLOSED,
    FAILED,
    IN_CHUNK,
    OPEN,
    OPENING,
    PLAN_ACTIVE,
    PLAN_ENDED,
    PLAN_FAILED,
    Store,
    Verified,
    report_digest,
)
from svtagg.servers.store.sqlite import SqliteStore
from svtagg.vdaf.field import FIELD128

#: A factory: `opener()` opens (or reopens) the test's store.
Opener = Callable[[], Store]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Opener]]:
    opened: list[Store] = []
    if request.param == "sqlite":

        def opener() -> Store:
            opened.append(SqliteStore(tmp_path / "s.sqlite"))
            return opened[-1]

        yield "sqlite", opener
    else:
        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
        from svtagg.servers.store.postgres import PgStore

        url = os.environ[PG_ENV]
        schema = f"t_{uuid.uuid4().hex[:16]}"

        def opener() -> Store:
            opened.append(PgStore(url, schema=schema))
            return opened[-1]

        yield "postgres", opener
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    for s in opened:
        try:
            s.close()
        except Exception:  # noqa: BLE001, S110 - already closed
            pass


@pytest.fixture
def store(backend: tuple[str, Opener]) -> Store:
    return backend[1]()


def params(task_id: str = "t", d: int = 3, n_max: int = 100, eps: int = 1) -> TaskParams:
    return TaskParams(task_id, d, 16, n_max, 1, Fraction(eps), Fraction(1, 10**6), Fraction(1, 10))


def batch(d: int, k: int, tag: bytes = b"") -> tuple[list[bytes], list[bytes], np.ndarray]:
    """k reports: ids, shares (8·d bytes each) and the shares' sum."""
    rng = np.random.default_rng(len(tag) * 1000 + k)
    vecs = rng.integers(0, 2**63, size=(k, d), dtype=np.uint64)
    ids = [tag + i.to_bytes(4, "big") + bytes(12 - len(tag)) for i in range(k)]
    return ids, [v.tobytes() for v in vecs], vecs.sum(axis=0, dtype=np.uint64)


def share_sum(shares: list[bytes]) -> Any:
    return np.sum([np.frombuffer(s, np.uint64) for s in shares], axis=0, dtype=np.uint64)


def agreed_task(store: Store, task_id: str = "t", eps: int = 1) -> None:
    store.create_task(params(task_id, eps=eps))
    store.close_collection(task_id)
    store.mark_agreed(task_id, None)


# ------------------------------------------------------------------ tasks
def test_create_and_read_tasks(store: Store) -> None:
    p = params("b", d=5, n_max=7)
    st = store.create_task(p)
    assert st.params == p and st.n == 0 and st.collection_open and not st.agreed
    assert st.digest == bytes(16) and st.streams == 0
    assert st.budget.epsilon_spent == 0 and st.budget.delta_spent == 0
    assert (store.sums("b") == 0).all() and store.sums("b").shape == (5,)
    assert store.robust_sums("b") is None
    store.create_task(params("a"))
    assert store.task_ids() == ["a", "b"]
    with pytest.raises(AlreadyExists):
        store.create_task(params("a", d=9))
    assert store.task("a").params.d == 3
    for call in (store.task, store.sums, store.robust_sums):
        with pytest.raises(NotFound):
            call("nope")  # type: ignore[operator]
    # a NUL in an id: no such task (SQLite), or an invalid id (PostgreSQL text)
    with pytest.raises((NotFound, InvalidArgument)):
        store.task("a\x00")
    validated = TaskParams("v", 2, 16, 10, 1, Fraction(1), Fraction(0), Fraction(1), True)
    assert store.create_task(validated).params.validate_reports
    # The embedding the clients use is kept with the task ("" = none recorded).
    hh = TaskParams("e", 4, 16, 10, 1, Fraction(1), Fraction(0), Fraction(1), False, "fp_loss")
    assert store.create_task(hh).params.embedding == "fp_loss"
    assert store.task("e").params == hh and store.task("a").params.embedding == ""


# ------------------------------------------------------------------ uploads
def test_uploads_add_up_and_replays_change_nothing(store: Store) -> None:
    store.create_task(params())
    ids, shares, total = batch(3, 10)
    assert store.add_reports("t", ids[:6], shares[:6], share_sum(shares[:6])) == 6
    assert store.add_reports("t", ids[6:], shares[6:], share_sum(shares[6:])) == 10
    before = store.task("t")
    assert (store.sums("t") == total).all()
    assert before.digest == report_digest(ids)
    # a replay of a whole batch, and a batch with one replayed id: refused whole
    for rids, sh in ((ids[:6], shares[:6]), ([b"fresh-report-id!", ids[9]], shares[:2])):
        with pytest.raises(AlreadyExists, match="replay"):
            store.add_reports("t", rids, sh, share_sum(sh))
    after = store.task("t")
    assert after == before and (store.sums("t") == total).all()
    assert sorted(store.report_ids("t")) == sorted(ids)
    assert store.shares("t", [ids[3], ids[0]]) == [shares[3], shares[0]]
    with pytest.raises(NotFound):
        store.shares("t", [b"never uploaded.."])


def test_a_replay_into_a_full_task_is_refused_as_a_replay(store: Store) -> None:
    """A batch resent after a lost answer must read as held (a replay), also
    when it would not fit: a resuming client counts it as stored."""
    store.create_task(params(n_max=4))
    ids, shares, _ = batch(3, 4)
    store.add_reports("t", ids, shares, share_sum(shares))
    with pytest.raises(AlreadyExists, match="replay"):
        store.add_reports("t", ids, shares, share_sum(shares))
    with pytest.raises(ResourceExhausted, match="n_max"):
        fresh, more, _ = batch(3, 1, b"more")
        store.add_reports("t", fresh, more, share_sum(more))
    assert store.task("t").n == 4


def test_upload_refusals(store: Store) -> None:
    store.create_task(params(n_max=4))
    ids, shares, _ = batch(3, 5)
    with pytest.raises(NotFound):
        store.add_reports("nope", ids[:1], shares[:1], share_sum(shares[:1]))
    with pytest.raises(ResourceExhausted, match="n_max"):
        store.add_reports("t", ids, shares, share_sum(shares))
    with pytest.raises(InvalidArgument, match="d=3"):
        store.add_reports("t", ids[:1], shares[:1], np.zeros(4, np.uint64))
    assert store.task("t").n == 0
    store.add_reports("t", ids[:2], shares[:2], share_sum(shares[:2]))
    closed = store.close_collection("t")
    assert not closed.collection_open and closed.n == 2
    with pytest.raises(FailedPrecondition, match="closed"):
        store.add_reports("t", ids[2:3], shares[2:3], share_sum(shares[2:3]))
    assert store.task("t").n == 2


def test_reconciliation_removes_reports_and_agreement_keeps_aggregates(store: Store) -> None:
    store.create_task(params())
    ids, shares, total = batch(3, 8)
    store.add_reports("t", ids, shares, share_sum(shares))
    with pytest.raises(FailedPrecondition, match="after the close"):
        store.remove_reports("t", ids[:1], share_sum)
    store.close_collection("t")
    assert store.remove_reports("t", [], share_sum).n == 8
    st = store.remove_reports("t", [ids[1], b"not a report id!", ids[5]], share_sum)
    kept = [i for i in range(8) if i not in (1, 5)]
    assert st.n == 6 and st.digest == report_digest([ids[i] for i in kept])
    assert (store.sums("t") == share_sum([shares[i] for i in kept])).all()
    assert sorted(store.report_ids("t")) == sorted(ids[i] for i in kept)
    assert (total - store.sums("t") == share_sum([shares[1], shares[5]])).all()
    robust = np.array([1, 2, 2**64 - 1], np.uint64)
    st = store.mark_agreed("t", robust)
    assert st.agreed and (store.robust_sums("t") == robust).all()
    with pytest.raises(FailedPrecondition, match="agreed"):
        store.remove_reports("t", ids[:1], share_sum)
    assert store.task("t").n == 6


# ------------------------------------------------------------------ ledger and streams
def test_verified_batches_fold_in_the_field_with_ids_only(store: Store) -> None:
    """A task with a validity circuit: the helper's shares wait as pending until
    their batch is verified; a verified batch folds its sum mod p (not mod 2^64),
    stores its ids, records its verdicts once and counts its refusals — all in
    one transaction; the close drops what is still pending."""
    p = replace(params(), validity="range")
    t = store.create_task(p, b"k" * 16)
    assert t.verify_key == b"k" * 16 and t.params.validity == "range"
    words = FIELD128.encoded_size // 8 * p.d
    assert store.sums("t").shape == (words,) and not store.sums("t").any()
    ids = [bytes([i]) * 16 for i in range(3)]
    assert store.add_pending("t", ids, [b"a", b"b", b"c"]) == 3
    assert store.add_pending("t", ids[:1], [b"other"]) == 3  # the first shares stay
    assert store.pending("t", [ids[0], b"z" * 16]) == [b"a", None]
    p_minus_1 = FIELD128.modulus - 1
    delta = np.frombuffer(FIELD128.encode_vec(FIELD128.vec([p_minus_1] * p.d)), "<u8")
    verified = Verified(b"B" * 16, b"\x00\x00\x01", {"invalid_proof": 1}, ids)
    assert store.add_reports("t", ids[:2], [b"s" * 16] * 2, delta, verified) == 2
    assert store.pending("t", ids) == [None, None, None]
    assert store.verdicts("t", b"B" * 16) == b"\x00\x00\x01"
    assert store.verdicts("t", b"C" * 16) is None
    assert dict(store.task("t").rejected) == {"invalid_proof": 1}
    one = np.frombuffer(FIELD128.encode_vec(FIELD128.vec([2] * p.d)), "<u8")
    store.add_reports("t", [b"x" * 16], [b"s" * 16], one, Verified(b"", b"\x00", {}, []))
    # (p − 1) + 2 = 1 mod p: a ring sum would have given 2^128 + 1 in two words
    assert FIELD128.to_ints(FIELD128.decode_vec(store.sums("t").tobytes())) == [1] * p.d
    with pytest.raises(AlreadyExists):  # a verified id comes back to the helper
        store.add_pending("t", ids[:1], [b"a"])
    store.add_pending("t", [b"q" * 16], [b"q"])
    store.close_collection("t")
    assert store.pending("t", [b"q" * 16]) == [None]
    assert store.verdicts("t", b"B" * 16) is None
    taken = store.remove_reports("t", [b"x" * 16], lambda shares: one)
    assert taken.n == 2
    assert FIELD128.to_ints(FIELD128.decode_vec(store.sums("t").tobytes())) == [p_minus_1] * p.d


def test_opening_a_stream_charges_the_ledger_or_nothing(store: Store) -> None:
    agreed_task(store)
    store.open_stream("s1", "t", StreamKind.LAP24, Fraction(1, 2), Fraction(0), Fraction(0))
    s = store.stream("s1")
    assert (s.state, s.task_id, s.kind, s.epsilon, s.gamma) == (
        OPENING,
        "t",
        StreamKind.LAP24,
        Fraction(1, 2),
        None,
    )
    assert store.task("t").budget.epsilon_spent == Fraction(1, 2)
    with pytest.raises(AlreadyExists):
        store.open_stream("s1", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    with pytest.raises(BudgetExhausted):
        store.open_stream("s2", "t", StreamKind.CTT, Fraction(3, 4), Fraction(0), Fraction(0))
    with pytest.raises(NotFound):
        store.stream("s2")  # refused whole: no stream, no charge
    with pytest.raises(NotFound):
        store.open_stream("s3", "nope", StreamKind.LAP24, Fraction(1), Fraction(0), Fraction(0))
    st = store.task("t")
    assert st.budget.epsilon_spent == Fraction(1, 2) and st.streams == 1
    store.open_stream(
        "s4", "t", StreamKind.EXP3, Fraction(1, 2), Fraction(1, 10**7), Fraction(1, 10**7)
    )
    assert store.task("t").budget.delta_spent == Fraction(1, 10**7)
    assert store.stream("s4").delta == Fraction(1, 10**7)


def test_stream_life_chunks_and_ends(store: Store) -> None:
    agreed_task(store)
    for sid in ("a", "b", "c"):
        store.open_stream(sid, "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    with pytest.raises(FailedPrecondition, match="answers no more"):
        store.begin_chunk("a")  # still opening
    store.set_threshold_noise("a", -12345)
    with pytest.raises(FailedPrecondition, match="not being opened"):
        store.set_threshold_noise("a", 7)
    a = store.stream("a")
    assert a.state == OPEN and a.gamma == -12345 and not a.closed
    assert store.begin_chunk("a") == 1
    assert store.stream("a").state == IN_CHUNK
    with pytest.raises(FailedPrecondition):
        store.begin_chunk("a")  # one chunk at a time
    store.end_chunk("a", 5, close=False)
    assert store.begin_chunk("a", 2) == 2
    store.end_chunk("a", 3, close=True)
    a = store.stream("a")
    assert (a.state, a.chunks, a.queries) == (CLOSED, 2, 8) and a.closed
    with pytest.raises(FailedPrecondition, match="closed"):
        store.begin_chunk("a")
    # the helper's numbering: only the next chunk
    store.set_threshold_noise("b", 2**62)
    with pytest.raises(FailedPrecondition, match="out of order"):
        store.begin_chunk("b", 2)
    assert store.begin_chunk("b", 1) == 1
    store.fail_stream("b")
    assert store.stream("b").state == FAILED
    store.fail_stream("a")  # a closed stream stays closed
    assert store.stream("a").state == CLOSED
    # the leader's confirmation after the helper has drawn its noise
    store.set_threshold_noise("c", 3, open_now=False)
    assert store.stream("c").state == OPENING
    store.confirm_stream("c")
    assert store.stream("c").state == OPEN
    with pytest.raises(FailedPrecondition):
        store.confirm_stream("c")
    assert store.stream_ids("t", CLOSED) == ["a"]
    assert store.stream_ids("t", FAILED) == ["b"] and store.stream_ids("t", OPEN) == ["c"]
    assert store.task("t").budget.epsilon_spent == Fraction(3, 8)  # nothing refunded
    with pytest.raises(NotFound):
        store.stream("nope")


def test_stream_ids_keep_opening_order(store: Store) -> None:
    agreed_task(store)
    names = ["z", "m", "a", "q"]
    for sid in names:
        store.open_stream(sid, "t", StreamKind.LAP3, Fraction(1, 16), Fraction(0), Fraction(0))
    assert store.stream_ids("t", OPENING) == names


# ------------------------------------------------------------------ plans
def test_plans_reserve_admit_refund_and_fail(store: Store) -> None:
    agreed_task(store)
    book = PlanBook.reserve([Group(Fraction(1, 4)), Group(Fraction(1, 4))])
    store.reserve_plan("p", "t", book)
    assert store.task("t").budget.epsilon_spent == Fraction(1, 2)
    with pytest.raises(AlreadyExists):
        store.reserve_plan("p", "t", book)
    with pytest.raises(BudgetExhausted):
        store.reserve_plan("big", "t", PlanBook.reserve([Group(Fraction(3, 4))]))
    with pytest.raises(NotFound):
        store.plan("big")
    e8, zero = Fraction(1, 8), Fraction(0)
    store.open_stream("s", "t", StreamKind.LAP24, e8, zero, zero, ("p", 0))
    with pytest.raises(InvalidArgument, match="plan group 0"):
        store.open_stream(
            "s2", "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0), ("p", 0)
        )
    assert store.task("t").budget.epsilon_spent == Fraction(1, 2)  # streams ride on the plan
    got, state, task_id = store.plan("p")
    assert state == PLAN_ACTIVE and task_id == "t" and got.spent[0] == (Fraction(1, 8), 0)
    assert store.plan_ids("t", PLAN_ACTIVE) == ["p"]
    assert store.end_plan("p") == (Fraction(3, 8), Fraction(0))
    assert store.end_plan("p") == (Fraction(0), Fraction(0))  # idempotent
    assert store.task("t").budget.epsilon_spent == Fraction(1, 8)
    with pytest.raises(FailedPrecondition, match="ended"):
        store.open_stream(
            "s3", "t", StreamKind.LAP24, Fraction(1, 16), Fraction(0), Fraction(0), ("p", 1)
        )
    store.reserve_plan("q", "t", PlanBook.reserve([Group(Fraction(1, 4))]))
    store.fail_plan("q")
    assert store.end_plan("q") == (Fraction(0), Fraction(0))  # a failed plan never refunds
    assert store.plan_ids("t", PLAN_FAILED) == ["q"] and store.plan_ids("t", PLAN_ENDED) == ["p"]
    assert store.task("t").budget.epsilon_spent == Fraction(3, 8)


def test_replayed_streams_charge_where_they_were_opened(backend: tuple[str, Opener]) -> None:
    """Reconciliation's replay records a stream failed, with its plan, and its
    charge where the other server charged it: the task's ledger, an active
    plan's group, an ended basic plan's refund (the task is charged what the
    refund should have kept), a failed plan (nothing more).  Idempotent; the
    plan survives a reopen."""
    store = backend[1]()
    agreed_task(store, eps=4)
    e8, zero = Fraction(1, 8), Fraction(0)

    def spent() -> Fraction:
        return store.task("t").budget.epsilon_spent

    def replay(sid: str, eps: Fraction, plan: tuple[str, int] | None = None) -> None:
        store.open_stream(sid, "t", StreamKind.LAP24, eps, zero, zero, plan, replay=True)

    replay("a", e8)
    assert spent() == e8 and store.stream("a").state == FAILED and store.stream("a").plan is None
    replay("a", e8)  # again: nothing more
    assert spent() == e8
    store.reserve_plan("p", "t", PlanBook.reserve([Group(Fraction(1, 2)), Group(Fraction(1, 2))]))
    replay("b", e8, ("p", 1))
    assert spent() == e8 + 1 and store.plan("p")[0].spent[1] == (e8, 0)
    assert store.end_plan("p") == (Fraction(7, 8), zero)
    replay("c", e8, ("p", 0))
    assert spent() == e8 + Fraction(1, 8) + Fraction(1, 8)  # as if c had run before the end
    with pytest.raises(InvalidArgument, match="plan group 0"):
        replay("d", Fraction(1, 2), ("p", 0))
    store.reserve_plan("q", "t", PlanBook.reserve([Group(Fraction(1, 4))]))
    store.fail_plan("q")
    before = spent()
    replay("e", e8, ("q", 0))
    assert spent() == before and store.plan("q")[0].spent[0] == (e8, 0)
    with pytest.raises(NotFound):
        replay("f", e8, ("nope", 0))
    with pytest.raises(NotFound):
        store.stream("f")  # refused whole: nothing recorded
    store.open_stream("g", "t", StreamKind.LAP24, e8, zero, zero)
    store.close()
    again = backend[1]()
    assert again.stream("c").plan == ("p", 0) and again.stream("g").plan is None


def test_robust_shares_are_staged_per_pass(store: Store) -> None:
    """Each pass stages apart: a late chunk of an abandoned pass never replaces
    a newer pass's shares, and only the named pass's shares are taken."""
    store.create_task(params("t", d=6))
    a, b = b"A" * 16, b"B" * 16
    store.stage_robust("t", a, b"D", 0, np.arange(4, dtype=np.uint64))
    store.stage_robust("t", b, b"D", 0, np.full(4, 9, dtype=np.uint64))
    store.stage_robust("t", b, b"D", 4, np.array([7, 8], dtype=np.uint64))
    assert store.staged_robust("t", a, b"D", 6) is None  # pass A is incomplete
    store.stage_robust("t", a, b"D", 0, np.arange(4, dtype=np.uint64) + 100)  # late, pass A
    assert list(store.staged_robust("t", b, b"D", 6)) == [9, 9, 9, 9, 7, 8]
    assert store.staged_robust("t", b, b"other", 6) is None  # another report set
    store.clear_staged("t")
    assert store.staged_robust("t", b, b"D", 6) is None


# ------------------------------------------------------------------ restarts
def test_reopen_keeps_everything_and_fails_interrupted_streams(
    backend: tuple[str, Opener],
) -> None:
    opener = backend[1]
    store = opener()
    store.create_task(params())
    ids, shares, total = batch(3, 6)
    store.add_reports("t", ids, shares, share_sum(shares))
    store.close_collection("t")
    store.mark_agreed("t", None)
    for sid in ("mid", "half", "done", "ok"):
        store.open_stream(sid, "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    for sid in ("mid", "done", "ok"):
        store.set_threshold_noise(sid, 1)
    store.begin_chunk("mid")
    store.begin_chunk("done")
    store.end_chunk("done", 4, close=True)
    store.close()  # as if killed: the in_chunk and opening marks are committed
    again = opener()
    assert again.failed_on_recovery == 2
    assert sorted(again.recovered_failed) == [("half", "t"), ("mid", "t")]
    assert again.stream("mid").state == FAILED and again.stream("half").state == FAILED
    assert again.stream("done").state == CLOSED and again.stream("ok").state == OPEN
    st = again.task("t")
    assert st.n == 6 and st.agreed and st.digest == report_digest(ids)
    assert st.budget.epsilon_spent == Fraction(1, 2)  # never refunded
    assert (again.sums("t") == total).all()
    with pytest.raises(FailedPrecondition):
        again.begin_chunk("mid")
    assert again.begin_chunk("ok") == 1
    again.close()
    third = opener()
    assert third.failed_on_recovery == 1 and third.recovered_failed == [("ok", "t")]


def test_reopen_lists_the_plans_active_at_the_stop(backend: tuple[str, Opener]) -> None:
    """A reopened store names the plans that were active when it stopped (a
    leader killed inside ReservePlan may hold one the helper never reserved;
    reconciliation reserves those there too); they stay active, with their
    charge and their admitted streams."""
    opener = backend[1]
    store = opener()
    agreed_task(store)
    quarter = PlanBook.reserve([Group(Fraction(1, 8)), Group(Fraction(1, 8))])
    for plan_id in ("live", "ended", "failed"):
        store.reserve_plan(plan_id, "t", quarter)
    store.open_stream(
        "s", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0), ("live", 0)
    )
    store.end_plan("ended")
    store.fail_plan("failed")
    assert store.recovered_plans == []  # nothing was active at its start
    store.close()
    again = opener()
    assert again.recovered_plans == [("live", "t")]
    book, state, _ = again.plan("live")
    assert state == PLAN_ACTIVE and book.spent[0] == (Fraction(1, 8), 0)
    assert again.task("t").budget.epsilon_spent == Fraction(1, 2)
    again.close()


def test_open_store_selects_the_backend(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    assert sqlite_file(path) == str(path)
    assert sqlite_file(f"sqlite:///{path}") == str(path)
    assert sqlite_file("sqlite:///rel/x.db") == "rel/x.db"
    assert sqlite_file("postgresql://u@h:5432/db") is None
    assert sqlite_file("postgres://u@h/db") is None
    with pytest.raises(InvalidArgument, match="mysql"):
        sqlite_file("mysql://u@h/db")
    s = open_store(f"sqlite:///{path}")
    assert type(s) is SqliteStore and path.exists()
    s.close()


# ------------------------------------------------------------------ PostgreSQL only
@pytest.fixture
def pg(backend: tuple[str, Opener]) -> Store:
    if backend[0] != "postgres":
        pytest.skip("PostgreSQL constraints")
    return backend[1]()


def test_pg_spends_are_an_append_only_journal(pg: Store) -> None:
    import psycopg

    agreed_task(pg)
    pg.open_stream("s", "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0))
    pg.reserve_plan("p", "t", PlanBook.reserve([Group(Fraction(1, 4))]))
    pg.end_plan("p")
    journal = pg.spends("t")  # type: ignore[attr-defined]
    assert journal == [(Fraction(1, 4), 0), (Fraction(1, 4), 0), (Fraction(-1, 4), 0)]
    assert sum(e for e, _ in journal) == pg.task("t").budget.epsilon_spent
    conn = pg._conn  # type: ignore[attr-defined]
    for statement in ("UPDATE spends SET epsilon = '0'", "DELETE FROM spends", "TRUNCATE spends"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(statement)
    assert len(pg.spends("t")) == 3  # type: ignore[attr-defined]


def test_pg_constraints_refuse_double_counting_and_reopening(pg: Store) -> None:
    import psycopg

    pg.create_task(params())
    ids, shares, _ = batch(3, 2)
    pg.add_reports("t", ids, shares, share_sum(shares))
    conn = pg._conn  # type: ignore[attr-defined]
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO reports (task_id, report_id) VALUES ('t', %s)", (ids[0],))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE tasks SET n = n_max + 1")
    pg.close_collection("t")
    pg.mark_agreed("t", None)
    with pytest.raises(FailedPrecondition, match="dropped"):
        pg.shares("t", ids[:1])  # per-report shares are gone after the agreement
    assert conn.execute("SELECT COUNT(*) FROM reports WHERE share IS NOT NULL").fetchone()[0] == 0
    pg.open_stream("s", "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0))
    pg.fail_stream("s")
    with pytest.raises(psycopg.errors.RaiseException, match="final"):
        conn.execute("UPDATE streams SET state = 'open'")


def test_pg_sessions_commit_durably_at_read_committed(pg: Store) -> None:
    conn = pg._conn  # type: ignore[attr-defined]
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    assert conn.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
    agreed_task(pg)
    pg.open_stream("s", "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0))
    pg.set_threshold_noise("s", 1)
    pg.begin_chunk("s")
    pg.end_chunk("s", 1, close=False)  # committed with synchronous_commit off, locally
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)  # and only there
    assert pg.stream("s").queries == 1


def test_pg_schema_is_versioned(backend: tuple[str, Opener]) -> None:
    if backend[0] != "postgres":
        pytest.skip("PostgreSQL schema versions")
    from svtagg.servers.store.postgres import PgStore

    first = backend[1]()
    assert isinstance(first, PgStore) and first.schema_version() == PgStore.SCHEMA_VERSION
    first._conn.execute("UPDATE svtagg_schema SET version = version + 1")
    first.close()
    with pytest.raises(RuntimeError, match="upgrade svtagg"):
        backend[1]()


def test_sqlite_schema_v2_gains_the_embedding_column(tmp_path: Path) -> None:
    """A store written before tasks recorded their embedding (schema 2) opens:
    the column is added with "" (none recorded), and the version moves on."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    store = SqliteStore(path)
    store.create_task(params("old"))
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE tasks DROP COLUMN embedding")
    raw.execute("DROP TABLE svtagg_schema")  # as a version-2 store had none
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    store = SqliteStore(path)
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SqliteStore.LEGACY_VERSION
        assert store.schema_version() == SqliteStore.SCHEMA_VERSION
        assert store.task("old").params.embedding == ""
        assert store.task("old").params == params("old")
    finally:
        store.close()


def test_sqlite_schema_v3_streams_gain_their_plan(tmp_path: Path) -> None:
    """A store written before streams recorded their plan (schema 3) opens: its
    streams read as charged to the task's ledger, new ones keep their plan."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    store = SqliteStore(path)
    agreed_task(store)
    store.open_stream("s", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0))
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE streams DROP COLUMN plan_id")
    raw.execute("ALTER TABLE streams DROP COLUMN plan_group")
    raw.execute("DROP TABLE svtagg_schema")
    raw.execute("PRAGMA user_version = 3")
    raw.commit()
    raw.close()
    store = SqliteStore(path)
    try:
        assert (
            store._db.execute("PRAGMA user_version").fetchone()[0]
            == SqliteStore.LEGACY_VERSION
            == 9
        )
        assert store.schema_version() == SqliteStore.SCHEMA_VERSION == 13
        assert store.stream("s").plan is None and store.stream("s").state == FAILED
        assert store.noisy_max_carry("s") is None  # v7: no carried winner
        # v5: a task made before validity proofs takes plain shares, none refused
        assert store.task("t").params.validity == "" and store.task("t").rejected == ()
        assert store.task("t").params.noise == "independent"  # v6: the noise option
        store.reserve_plan("p", "t", PlanBook.reserve([Group(Fraction(1, 4))]))
        store.open_stream(
            "u", "t", StreamKind.LAP24, Fraction(1, 8), Fraction(0), Fraction(0), ("p", 0)
        )
        assert store.stream("u").plan == ("p", 0)
    finally:
        store.close()


def test_pg_schema_v4_streams_gain_their_plan_and_staging_its_pass(pg_url: tuple[str, str]) -> None:
    """A PostgreSQL store at schema 4 opens at the current version: its streams
    read as charged to the task's ledger, and shares staged without a pass are
    dropped (a close in progress runs its pass again)."""
    import psycopg

    from svtagg.servers.store.postgres import PgStore
    from svtagg.servers.store.postgres_schema import MIGRATIONS

    url, tag = pg_url
    schema = f"v4_{tag}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET search_path TO "{schema}"')
        for step in MIGRATIONS[:4]:
            for statement in step:
                conn.execute(statement.encode())
        conn.execute(
            "CREATE TABLE svtagg_schema (one BOOLEAN PRIMARY KEY DEFAULT TRUE, version INTEGER)"
        )
        conn.execute("INSERT INTO svtagg_schema (version) VALUES (4)")
        conn.execute(
            "INSERT INTO tasks (task_id, d, frac_bits, n_max, min_batch, epsilon_total,"
            " delta_total, epsilon_min, digest, sums) VALUES ('t', 2, 16, 10, 1, '1', '0',"
            " '1/10', '\\x00', '\\x00')"
        )
        conn.execute(
            "INSERT INTO streams (stream_id, task_id, kind, epsilon, delta, state)"
            " VALUES ('s', 't', 'lap24', '1/8', '0', 'failed')"
        )
        conn.execute(
            "INSERT INTO robust_staged (task_id, digest, lo, hi, shares)"
            " VALUES ('t', '\\x00', 0, 2, '\\x00')"
        )
    store = PgStore(url, schema=schema)
    try:
        assert store.schema_version() == PgStore.SCHEMA_VERSION == 13
        assert store.stream("s").plan is None
        assert store.noisy_max_carry("s") is None  # v9: no carried winner
        # v7: the work table takes report-noisy-max jobs
        (check,) = store._conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'work_kind_check' AND connamespace = %s::regnamespace",
            (schema,),
        ).fetchone()
        assert "'nmax'" in check and "'validate'" not in check
        assert "'noise'" in check  # v10: noise batches may be jobs
        # v10: the joint-noise pools, empty for a stream stored before
        assert store.joint_pool("s").runs == () and store.joint_pool("s").used == 0
        # v6: a task made before validity proofs takes plain shares, none refused
        assert store.task("t").params.validity == "" and store.task("t").rejected == ()
        assert store.task("t").params.noise == "independent"  # v8: the noise option
        assert store._conn.execute("SELECT count(*) FROM robust_staged").fetchone() == (0,)
        store.stage_robust("t", b"P" * 16, b"\x00", 0, np.arange(2, dtype=np.uint64))
        assert list(store.staged_robust("t", b"P" * 16, b"\x00", 2)) == [0, 1]
    finally:
        store.close()


# ------------------------------------------------------------------ the shared history
def test_one_history_runs_on_both_dialects(
    backend: tuple[str, Opener], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both dialects stand at the shared history's version; a step added to it
    (here a made-up v14) runs on a store of either dialect at its next open,
    written once for both; a store newer than the code is refused."""
    from svtagg.servers.store import migrations, sql

    name, opener = backend
    store = opener()
    assert store.schema_version() == migrations.VERSION == 13
    store.create_task(params("t"))
    store.close()
    step = migrations.Migration(
        14, "a test table", ("CREATE TABLE shared_step (x INTEGER NOT NULL)",)
    )
    monkeypatch.setattr(sql, "HISTORY", (*migrations.HISTORY, step))
    from svtagg.servers.store.sql import SqlStore

    for cls in {type(store), SqlStore}:
        monkeypatch.setattr(cls, "SCHEMA_VERSION", 14)
    store = opener()
    assert store.schema_version() == 14 and store.task("t").params == params("t")
    assert store._one("SELECT COUNT(*) FROM shared_step") == (0,)  # type: ignore[attr-defined]
    store.close()
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="schema version 14"):
        opener()


def test_a_walks_levels_are_recorded_and_replaced(backend: tuple[str, Opener]) -> None:
    """The prefix crawl's record (schema 13, servers/crawl.py): a walk's levels
    come back in order, a level recorded again replaces its record, and
    another walk's are apart; they survive the store's reopening."""
    from svtagg.servers.store.rules import CrawlRecord

    _, opener = backend
    store = opener()
    one = CrawlRecord("w" * 32, 1, "t", 0, 8, b"", b"")
    two = CrawlRecord("w" * 32, 2, "t", 8, 8, (5).to_bytes(32, "big"), b"\x03\x00\x00\x00")
    store.add_crawl_level(two)
    store.add_crawl_level(one)
    store.add_crawl_level(CrawlRecord("v" * 32, 1, "t", 0, 4, b"", b""))
    again = CrawlRecord("w" * 32, 2, "t", 8, 4, (6).to_bytes(32, "big"), b"")
    store.add_crawl_level(again)
    store.close()
    store = opener()
    try:
        assert store.crawl_levels("w" * 32) == [one, again]
        assert [r.steps for r in store.crawl_levels("v" * 32)] == [4]
        assert store.crawl_levels("x" * 32) == []
    finally:
        store.close()
