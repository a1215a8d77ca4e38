"""The prefix crawl through the servers (servers/crawl.py): a `crawl:B` task
verifies each string report's first level at ingest and keeps the reports on
both servers; a walk's levels are CRAWL streams charged on both ledgers,
checked on both servers (a report that cheats deeper is taken out at its
level), compared in the garbled circuit, and only each candidate's bit comes
back.  The leader's refusals come before any charge; the helper enforces its
own walk against a leader that lies.  The mechanism and its audits:
tests/test_crawl.py; the keys: tests/test_vdaf_crawl.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import Deployment, off_loop, pg_tagged

from svtagg.analyst.crawl import decode_string, encode_string
from svtagg.dp.crawl import CrawlPlan, above_probability, level_scale
from svtagg.dp.errors import FailedPrecondition, InvalidArgument, PeerUnavailable
from svtagg.dp.kinds import StreamKind
from svtagg.proto import svtagg_pb2 as pb
from svtagg.servers.crawl import Walks
from svtagg.servers.edge import wire
from svtagg.servers.exchange.values import CrawlLevel, CrawlStep, OpenStream
from svtagg.servers.ingest.validity import task_validity
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.store.postgres import PgStore
from svtagg.vdaf.crawl import Level, PrefixDpf
from svtagg.vdaf.sparse import NONCE_SIZE, RAND_SIZE

BITS = 16  # two-byte strings: a walk of a few levels runs in a second
WORDS = ["hi", "ok", "no", "go", "up", "we", "be", "do"]


def crawl_spec(task_id: str, bits: int = BITS, eps_total: str = "40") -> pb.TaskSpec:
    return pb.TaskSpec(
        task_id=task_id,
        d=1,
        frac_bits=1,
        n_max=10_000,
        min_batch=1,
        epsilon_total=eps_total,
        delta_total="0",
        epsilon_min="1/100",
        validity=f"crawl:{bits}",
        embedding="strings",
    )


def population(n: int = 240) -> list[str]:
    """Words with counts 120, 60, 30, 15, ... (the heavy ones are clear)."""
    out: list[str] = []
    share = n // 2
    for w in WORDS:
        out += [w] * max(share, 1)
        share //= 2
    return out[:n]


async def upload(pair: ReferencePair, task_id: str, words: list[str]) -> tuple[int, dict[str, int]]:
    v = task_validity(pair.leader.core.task(task_id))
    ids = [os.urandom(NONCE_SIZE) for _ in words]
    shards = v.shard_strings([encode_string(w, v.bits) for w in words], ids)
    got = await pair.send_proofs(task_id, ids, shards)
    return got.accepted, got.rejected


class ServerOracle:
    """`analyst.crawl.LevelOracle` over the leader driver (what the SDK's
    remote oracle does over gRPC)."""

    def __init__(self, pair: ReferencePair, task_id: str) -> None:
        self.pair, self.task_id = pair, task_id
        self.walk_id, self.depth = "", 0
        self.refused: list[int] = []

    async def level(
        self, candidates: list[int], prefix_bits: int, eps: Fraction, tau: int
    ) -> list[bool]:
        steps = prefix_bits - self.depth
        parents = tuple(dict.fromkeys(c >> steps for c in candidates)) if self.depth else ()
        answer = await self.pair.leader.crawl_level(
            CrawlLevel(self.task_id, self.walk_id, parents, self.depth, steps, str(eps), tau)
        )
        self.walk_id, self.depth = answer.walk_id, prefix_bits
        self.refused.append(answer.refused)
        return list(answer.above)


async def walk(
    pair: ReferencePair, task_id: str, plan: CrawlPlan
) -> tuple[list[str], ServerOracle]:
    """`analyst.crawl.crawl`'s walk, level by level, through the leader
    driver (on this event loop: `crawl` itself is synchronous, and the SDK's
    walk over gRPC runs it, below)."""
    oracle = ServerOracle(pair, task_id)
    kept, depth = [0], 0
    for level in range(1, plan.levels + 1):
        bits = plan.prefix_bits(level)
        steps = bits - depth
        candidates = [(p << steps) | x for p in kept for x in range(1 << steps)]
        got = await oracle.level(candidates, bits, plan.level_epsilon, plan.threshold)
        kept = [c for c, yes in zip(candidates, got, strict=True) if yes]
        depth = bits
        if not kept:
            break
    return [decode_string(x, plan.bits) for x in kept], oracle


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_walk_through_the_servers_finds_the_heavy_strings(
    tmp_path: Path, store: str
) -> None:
    """Both stores keep a crawl task's reports past the agreement."""
    words = population()
    async with contextlib.AsyncExitStack() as stack:
        stores = None
        if store == "postgres":
            url, tag = stack.enter_context(pg_tagged())
            stores = (PgStore(url, schema=f"l_{tag}"), PgStore(url, schema=f"h_{tag}"))
        pair = await stack.enter_async_context(reference_pair(tmp_path, stores=stores))
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(crawl_spec("w")))
        assert await upload(pair, "w", words) == (len(words), {})
        await pair.leader.close_collection("w")
        plan = CrawlPlan(BITS, 4, Fraction(16), threshold=20)
        found, oracle = await walk(pair, "w", plan)
        heavy = {w for w, c in Counter(words).items() if c >= 30}
        assert heavy <= set(found)
        assert set(found) <= set(words)  # nothing not uploaded (noise scale 1/2 here)
        assert oracle.refused == [0] * plan.levels
        # Each level charged its ε on both ledgers.
        for side in (pair.leader, pair.helper):
            assert side.core.task("w").budget.epsilon_spent == plan.epsilon
        # Each level is a closed CRAWL stream on both servers.
        await pair.helper.settled()  # the leader answers before the helper's record
        streams = pair.leader.core.store.stream_ids("w", "closed")
        assert len(streams) == plan.levels
        assert pair.helper.core.store.stream_ids("w", "closed") == streams


async def test_hostile_reports_are_refused_at_ingest_or_at_their_level(tmp_path: Path) -> None:
    """A weight of two and a key changed for one server are refused at ingest
    (the first level's check); a report whose third level's output
    correction is changed passes ingest and is taken out at that level, so
    no count holds it."""
    async with reference_pair(tmp_path) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(crawl_spec("h")))
        v = task_validity(pair.leader.core.task("h"))
        dpf = PrefixDpf(BITS)
        honest = [encode_string("hi", BITS)] * 30
        ids = [os.urandom(NONCE_SIZE) for _ in range(33)]
        shards = v.shard_strings(honest, ids[:30])
        public, keys = dpf.gen(encode_string("ok", BITS), ids[30], os.urandom(RAND_SIZE), weight=2)
        shards.append((public, keys[0], keys[1]))
        public, keys = dpf.gen(encode_string("ok", BITS), ids[31], os.urandom(RAND_SIZE))
        shards.append((public, keys[0], bytes([keys[1][0] ^ 1]) + keys[1][1:]))
        public, keys = dpf.gen(encode_string("ok", BITS), ids[32], os.urandom(RAND_SIZE))
        levels = dpf.decode(public)
        lv = levels[2]
        levels[2] = Level(lv.seed, lv.ctrl, lv.proof, (lv.output + 5) % (2**128 - 159))
        shards.append((dpf.encode(levels), keys[0], keys[1]))
        got = await pair.send_proofs("h", ids, shards)
        assert (got.accepted, got.rejected) == (31, {"invalid_proof": 2})
        await pair.leader.close_collection("h")
        plan = CrawlPlan(BITS, 4, Fraction(16), threshold=20)
        found, oracle = await walk(pair, "h", plan)
        assert found == ["hi"]
        assert oracle.refused == [1, 0, 0, 0]  # level 1 holds binary levels 1-4


async def test_refusals_before_any_charge(tmp_path: Path) -> None:
    async with reference_pair(tmp_path) as pair:
        leader = pair.leader
        await leader.create_task(wire.TASK_SPEC.from_pb(crawl_spec("c")))
        await upload(pair, "c", ["hi"] * 5)
        with pytest.raises(FailedPrecondition, match="close the collection"):
            await leader.crawl_level(CrawlLevel("c", "", (), 0, 4, "1", 3))
        await leader.close_collection("c")
        for bad, match in [
            (CrawlLevel("c", "", (5,), 4, 4, "1", 3), "starts at the root"),
            (CrawlLevel("c", "", (), 0, 9, "1", 3), "1 to 8 bits"),
            (CrawlLevel("c", "", (), 0, 4, "1", 0), "tau"),
            (CrawlLevel("c", "f" * 32, (1,), 4, 4, "1", 3), "no level of walk"),
        ]:
            with pytest.raises((InvalidArgument, FailedPrecondition), match=match):
                await leader.crawl_level(bad)
        answer = await leader.crawl_level(CrawlLevel("c", "", (), 0, 4, "4", 3))
        spent = leader.core.task("c").budget.epsilon_spent
        assert spent == 4 and len(answer.above) == 16
        kept = [i for i, yes in enumerate(answer.above) if yes]
        for bad, match in [
            (CrawlLevel("c", answer.walk_id, (16,), 4, 4, "1", 3), "not a candidate"),
            (CrawlLevel("c", answer.walk_id, (3, 3), 4, 4, "1", 3), "distinct"),
            (CrawlLevel("c", answer.walk_id, tuple(kept), 8, 4, "1", 3), "no level of walk"),
            (CrawlLevel("c", answer.walk_id, tuple(kept), 4, 13, "1", 3), "bits"),
        ]:
            with pytest.raises((InvalidArgument, FailedPrecondition), match=match):
                await leader.crawl_level(bad)
        assert leader.core.task("c").budget.epsilon_spent == spent
        # A crawl level's stream is not opened by OpenStream, and a crawl task
        # answers no other stream; a crawl level needs a crawl task.
        with pytest.raises(InvalidArgument, match="CrawlLevel"):
            await leader.open_stream(OpenStream("c", StreamKind.CRAWL, "1"))
        with pytest.raises(InvalidArgument, match="crawl levels only"):
            await leader.open_stream(OpenStream("c", StreamKind.LAP24, "1"))
        assert leader.core.task("c").budget.epsilon_spent == spent


async def test_the_helper_holds_its_own_walk_against_a_lying_leader(tmp_path: Path) -> None:
    """A leader that sends the helper parents its walk never checked, or a
    walk it never started past the root, is refused there, and the level's
    stream fails on the helper (its charge stays spent)."""
    async with reference_pair(tmp_path) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(crawl_spec("l", eps_total="60")))
        await upload(pair, "l", ["hi"] * 5 + ["ok"] * 5)
        await pair.leader.close_collection("l")
        first = await pair.leader.crawl_level(CrawlLevel("l", "", (), 0, 4, "16", 3))
        kept = tuple(i for i, yes in enumerate(first.above) if yes)
        assert kept == (6,)  # "hi" and "ok" both start with the nibble 6
        second = await pair.leader.crawl_level(CrawlLevel("l", first.walk_id, kept, 4, 4, "16", 3))
        assert [i for i, yes in enumerate(second.above) if yes] == [8, 15]  # 0x68, 0x6f
        # The leader opens a CRAWL stream honestly, then lies in its CrawlStep:
        # a depth-8 prefix under the level-1 prefix 7, which the walk never
        # extended (so its nodes were never checked).
        info = await pair.leader.open_stream(OpenStream("l", StreamKind.CRAWL, "1"), crawl=True)
        task = pair.leader.core.task("l")
        walk = await pair.leader.core.walks.at(
            pair.leader.core.store, task, first.walk_id, 8, (0x68,), 0
        )
        lie = CrawlStep(info.stream_id, "l", first.walk_id, (0x72,), 8, 4, b"", walk.size)
        with pytest.raises(InvalidArgument, match="not a candidate"):
            await pair.port.crawl_step(lie)
        assert pair.helper.core.stream(info.stream_id).state == "failed"
        # A walk the helper never recorded is refused there too.
        info2 = await pair.leader.open_stream(OpenStream("l", StreamKind.CRAWL, "1"), crawl=True)
        other = CrawlStep(info2.stream_id, "l", "e" * 32, (0x68,), 8, 4, b"", walk.size)
        with pytest.raises(FailedPrecondition, match="no level of walk"):
            await pair.port.crawl_step(other)
        assert pair.helper.core.task("l").budget.epsilon_spent == 34
        # The honest walk goes on: the helper rebuilds it from its record.
        third = await pair.leader.crawl_level(
            CrawlLevel("l", first.walk_id, (0x68, 0x6F), 8, 4, "16", 3)
        )
        # "hi" = 0x68 0x69 and "ok" = 0x6F 0x6B: the nibble 6 under each parent
        assert sorted(i for i, yes in enumerate(third.above) if yes) == [6, 16 + 6]


# ----------------------------------------------------------------- the law, through the servers
def _g(seen: Counter[tuple[bool, ...]], law: dict[tuple[bool, ...], float]) -> float:
    n = sum(seen.values())
    return 2 * sum(c * math.log(c / (n * law[o])) for o, c in seen.items() if c)


async def _first_levels(pair: ReferencePair, runs: int) -> Counter[tuple[bool, ...]]:
    seen: Counter[tuple[bool, ...]] = Counter()
    for _ in range(runs):
        answer = await pair.leader.crawl_level(CrawlLevel("a", "", (), 0, 1, "1", 17))
        seen[answer.above] += 1
    return seen


async def test_the_servers_answers_fit_the_exact_law_and_half_scale_noise_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the servers (both drivers, the garbled comparison): 300 first
    levels over 8-bit strings, 20 users under the prefix 0 and 14 under 1,
    τ = 17, ε = 1, fit the exact law of the two candidates' answers (both
    servers' discrete Laplace of scale 2/ε; G within the 99.9 % point of
    χ²(3), 16.27).  Control: servers whose noise is scaled for sensitivity one
    (half the scale, a loss of 2ε) are rejected by the same test."""
    runs = 300
    t = level_scale(Fraction(1))
    p = [above_probability(c, 17, t, 2) for c in (20, 14)]
    law: dict[tuple[bool, ...], float] = {
        (a, b): (p[0] if a else 1 - p[0]) * (p[1] if b else 1 - p[1])
        for a in (False, True)
        for b in (False, True)
    }
    async with reference_pair(tmp_path) as pair:
        spec = crawl_spec("a", bits=8, eps_total=str(2 * runs))
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(spec))
        v = task_validity(pair.leader.core.task("a"))
        ids = [os.urandom(NONCE_SIZE) for _ in range(34)]
        values = [0b00000001] * 20 + [0b10000001] * 14  # 8-bit strings, as integers
        got = await pair.send_proofs("a", ids, v.shard_strings(values, ids))
        assert got.accepted == 34
        await pair.leader.close_collection("a")
        assert _g(await _first_levels(pair, runs), law) < 16.27

        import svtagg.servers.crawl as scrawl

        real = scrawl.draw_level_noise
        monkeypatch.setattr(scrawl, "draw_level_noise", lambda eps, k, rng: real(2 * eps, k, rng))
        assert _g(await _first_levels(pair, runs), law) > 16.27


async def test_a_walk_goes_on_after_both_servers_forget_it(tmp_path: Path) -> None:
    """What a restart does to a walk in memory (both servers' walks
    dropped): the next level is answered from each server's record of the
    levels it completed, the reports its checks refused left out; a level
    asked again (the walk rewound to an earlier depth) is answered too, under
    a charge of its own; a depth no recorded level reaches is refused."""
    words = ["hi"] * 30 + ["ok"] * 20 + ["no"] * 3
    async with reference_pair(tmp_path) as pair:
        await pair.leader.create_task(wire.TASK_SPEC.from_pb(crawl_spec("r", eps_total="64")))
        v = task_validity(pair.leader.core.task("r"))
        ids = [os.urandom(NONCE_SIZE) for _ in range(len(words) + 1)]
        shards = v.shard_strings([encode_string(w, BITS) for w in words], ids[:-1])
        dpf = PrefixDpf(BITS)
        public, keys = dpf.gen(encode_string("ok", BITS), ids[-1], os.urandom(RAND_SIZE))
        levels = dpf.decode(public)
        lv = levels[2]  # a report that passes ingest and fails at bit 3
        levels[2] = Level(lv.seed, lv.ctrl, lv.proof, (lv.output + 5) % (2**128 - 159))
        shards.append((dpf.encode(levels), keys[0], keys[1]))
        assert (await pair.send_proofs("r", ids, shards)).accepted == len(words) + 1
        await pair.leader.close_collection("r")
        first = await pair.leader.crawl_level(CrawlLevel("r", "", (), 0, 4, "16", 10))
        assert first.refused == 1 and [i for i, y in enumerate(first.above) if y] == [6]
        await pair.helper.settled()  # the helper's side of the level recorded
        for side in (pair.leader, pair.helper):
            side.core.walks = Walks()  # a restart: nothing in memory
        w = first.walk_id
        second = await pair.leader.crawl_level(CrawlLevel("r", w, (6,), 4, 4, "16", 10))
        assert second.refused == 0  # the refused report stayed out
        assert [i for i, y in enumerate(second.above) if y] == [8, 15]  # 0x68, 0x6f
        # The walk rewound: level 2 asked again, from level 1's record.
        again = await pair.leader.crawl_level(CrawlLevel("r", w, (6,), 4, 4, "16", 10))
        assert again.above == second.above and again.stream_id != second.stream_id
        with pytest.raises(FailedPrecondition, match="no level of walk"):
            await pair.leader.crawl_level(CrawlLevel("r", w, (0x68,), 12, 4, "16", 10))
        third = await pair.leader.crawl_level(CrawlLevel("r", w, (0x68, 0x6F), 8, 8, "16", 10))
        found = [i for i, y in enumerate(third.above) if y]
        assert found == [0x69, 256 + 0x6B]  # "hi", "ok"
        assert pair.leader.core.task("r").budget.epsilon_spent == 64
        await pair.helper.settled()
        assert pair.helper.core.task("r").budget.epsilon_spent == 64
        assert [r.level for r in pair.helper.core.store.crawl_levels(w)] == [1, 2, 3]


# ----------------------------------------------------------------- restarts, from outside
def _sdk(dep: Deployment) -> Any:
    import svtagg

    return svtagg.connect(dep.leader_addr, certs=dep.certs, helper=dep.helper_addr)


async def _walk_with_a_break(task: Any, between: Callable[[], Awaitable[None]]) -> Any:
    """`task.heavy_strings` (16-bit strings, 4 levels of 4 bits, ε 16, τ 10)
    on a thread, with `between` run on the event loop after level 2 and
    before level 3 asks anything; the walk's result (or its exception)."""
    loop = asyncio.get_running_loop()
    paused, go_on = threading.Event(), threading.Event()

    def progress(record: Any) -> None:
        if record.level == 2:
            paused.set()
            assert go_on.wait(60)

    walk = loop.run_in_executor(
        None, lambda: task.heavy_strings(16, stride=4, threshold=10, progress=progress)
    )
    assert await loop.run_in_executor(None, paused.wait, 60)
    try:
        await between()
    finally:
        go_on.set()
    return await walk


async def _lose_the_helper(dep: Deployment) -> None:
    assert dep.helper is not None
    await dep.helper.stop(0.5)
    dep.helper = None


async def test_a_walk_goes_on_across_restarts_and_resumes_after_a_failed_level(
    deployment: Deployment,
) -> None:
    """Through the gRPC servers and the SDK: both servers restarted between
    two levels, the walk goes on (each rebuilds it from its record); the
    helper lost during a level fails that level (the walk raises, the level's
    charge spent), and `heavy_strings(resume=True)` after the restart goes on
    from the last completed level and finds the heavy strings."""
    dep = deployment
    words = ["hi"] * 40 + ["ok"] * 30 + ["no"] * 2
    conn = await off_loop(_sdk, dep)
    task = await off_loop(conn.create_string_task, "s", 64, bits=16, min_batch=1)
    await off_loop(task.upload_strings, words, journal=False)
    await off_loop(task.close_collection)

    async def restart_both() -> None:
        await dep.stop()  # both servers, between levels 2 and 3
        await dep.start()

    result = await _walk_with_a_break(task, restart_both)
    assert sorted(result.strings()) == ["hi", "ok"] and result.done
    assert task.crawl_stats.levels == 4

    # The helper is lost during level 3 of a second walk.
    with pytest.raises(PeerUnavailable):
        await _walk_with_a_break(task, lambda: _lose_the_helper(dep))
    await dep.stop()
    await dep.start()
    result = await off_loop(task.heavy_strings, 16, stride=4, threshold=10, resume=True)
    assert sorted(result.strings()) == ["hi", "ok"] and len(result.levels) == 4
    spent = (await off_loop(task.budget)).exact["epsilon_spent"]
    assert spent >= 16 + 16  # two walks, and the failed level's charge
    with pytest.raises(FailedPrecondition, match="no walk"):
        await off_loop(task.heavy_strings, 16, stride=4, threshold=10, resume=True)
    await off_loop(conn.close)


def test_a_levels_comparison_width_covers_every_input() -> None:
    """The width both servers derive for a level's comparison: every
    |count + ν_L + ν_H − τ| the level can hold (counts ≤ n_max, τ ≤ 4·n_max,
    each draw within its clamp) is below 2^(w−1), and one bit less would not
    hold the extreme."""
    from svtagg.dp.kinds import clamp_bound
    from svtagg.servers.crawl import crawl_width

    for n_max, eps in [(1, Fraction(64)), (10_000, Fraction(1, 8)), (10**6, Fraction(1, 100))]:
        w = crawl_width(n_max, eps)
        extreme = 5 * n_max + 2 * clamp_bound(level_scale(eps))
        assert extreme < 1 << (w - 1)
        assert w == 2 or extreme >= 1 << (w - 2)


async def test_the_command_line_resumes_a_walk_another_process_recorded(
    deployment: Deployment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`svtagg analyst crawl --resume`: a walk whose third level failed (the
    helper lost) is recorded as the CLI records it (`walk_record`, under
    SVTAGG_STATE_DIR); after the restart a new process goes on from level 3
    and finds the heavy strings; the record is gone once the walk ends, and a
    second --resume is refused (exit 2), as is --resume with a plan."""
    import json

    from svtagg.deploy.cli import main
    from svtagg.deploy.connection import walk_journal_path

    monkeypatch.setenv("SVTAGG_STATE_DIR", str(tmp_path / "state"))
    dep = deployment
    conn = await off_loop(_sdk, dep)
    task = await off_loop(conn.create_string_task, "c", 64, bits=16, min_batch=1)
    await off_loop(task.upload_strings, ["hi"] * 40 + ["ok"] * 30, journal=False)
    await off_loop(task.close_collection)
    with pytest.raises(PeerUnavailable):
        await _walk_with_a_break(task, lambda: _lose_the_helper(dep))
    record = task.walk_record()
    assert record is not None and [lv[0] for lv in record["levels"]] == [1, 2]
    journal = walk_journal_path("c", conn._ca)
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps(record))
    await off_loop(conn.close)
    await dep.stop()
    await dep.start()
    cli = ["analyst", "crawl", "--leader", dep.leader_addr, "--certs", str(dep.certs)]
    cli += ["--task", "c"]
    assert await off_loop(main, [*cli, "--resume", "--epsilon", "16"]) == 2
    capsys.readouterr()
    assert await off_loop(main, [*cli, "--resume", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["found"]) == ["hi", "ok"]
    assert [lv["level"] for lv in out["levels"]] == [1, 2, 3, 4]
    assert not journal.exists()
    assert await off_loop(main, [*cli, "--resume"]) == 2
