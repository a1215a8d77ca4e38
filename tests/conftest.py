"""Shared fixtures for the server, client and integration tests: one throwaway CA
per session, and a leader + helper pair on free loopback ports running in the
test's own event loop (blocking clients are called through asyncio.to_thread)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from svtagg.mpc import native as mpc_native
from svtagg.mpc.channel import MemoryChannel
from svtagg.mpc.protocol import ComparisonEvaluator, ComparisonGarbler
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.tls import Identity, write_deployment
from svtagg.proto.vocab import Role
from svtagg.servers.exchange.party import PartyFactory, garbled_circuit_party
from svtagg.servers.reference import ReferencePair, reference_pair
from svtagg.servers.service import ServerConfig, SvtaggServer
from svtagg.vdaf import native as vdaf_native

T = TypeVar("T")


# -- the leader and helper drivers in one process (in-memory port, no TLS) ------------
#: The package's one-process reference, under the names the tests use.
DriverPair = ReferencePair
driver_pair = reference_pair


@contextlib.asynccontextmanager
async def failing_helper_pair(root: Path, method: str) -> AsyncIterator[DriverPair]:
    """A reference pair whose helper party fails its comparison `method`
    (first_yes, noisy_max, ...) while `pair.crash_helper[0]` is set: a helper
    lost mid-protocol, for the fail-closed tests."""
    crash = [False]

    def party(role: Role, channel: Any, sid: bytes) -> Any:
        p = garbled_circuit_party(role, channel, sid)
        if role == Role.HELPER:
            real = getattr(p, method)

            async def failing(*args: Any, **kw: Any) -> Any:
                if crash[0]:
                    raise RuntimeError(f"helper lost in {method}")
                return await real(*args, **kw)

            setattr(p, method, failing)
        return p

    async with driver_pair(root, party) as pair:
        pair.crash_helper = crash
        yield pair


async def cross_engine_pair(
    garbler: str, evaluator: str, session: bytes = b"cross"
) -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    """A garbler on one comparison engine and an evaluator on another (numpy /
    native) over one memory channel, base OTs done: one wire format for both."""
    before = mpc_native.active()
    cg, ce = MemoryChannel.pair()
    try:
        mpc_native.use(garbler)
        g = ComparisonGarbler(cg, session)
        mpc_native.use(evaluator)
        e = ComparisonEvaluator(ce, session)
    finally:
        mpc_native.use(before)
    await asyncio.gather(g.setup(), e.setup())
    return g, e


@pytest.fixture(params=vdaf_native.BACKENDS)
def vdaf_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Prio3 library's backend for one test: the native field core, then the
    Python-integer reference (tests use it through `usefixtures`)."""
    if request.param == "native" and not vdaf_native.available():
        pytest.skip("the native field core is not built here")
    with vdaf_native.using(request.param) as name:
        yield name


@pytest.fixture(params=["numpy", "native"])
def mpc_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """The comparison engine for one test: numpy, then the native core
    (skipped where it is not built)."""
    if request.param == "native" and not mpc_native.available():
        pytest.skip("native core not built")
    before = mpc_native.active()
    mpc_native.use(request.param)
    yield request.param
    mpc_native.use(before)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deployment(tmp_path_factory.mktemp("certs"))


def engine() -> PartyFactory:
    """The garbled-circuit engine (svtagg.mpc.protocol); tests use the real one."""
    return garbled_circuit_party


@dataclass
class Deployment:
    certs: Path
    root: Path
    leader: SvtaggServer | None = None
    helper: SvtaggServer | None = None
    helper_port: int = 0
    leader_port: int = 0

    @property
    def leader_addr(self) -> str:
        return f"127.0.0.1:{self.leader_port}"

    @property
    def helper_addr(self) -> str:
        return f"127.0.0.1:{self.helper_port}"

    def identity(self, role: str) -> Identity:
        return Identity.load(self.certs, role)

    async def start(
        self, party: PartyFactory | None = None, helper_data_port: int | None = 0
    ) -> None:
        """Start (or restart) both servers on their previous ports and stores;
        `helper_data_port` None: the helper offers no data channel."""
        party = party or engine()
        helper_listen = f"127.0.0.1:{self.helper_port}"
        self.helper = SvtaggServer(
            ServerConfig(
                Role.HELPER,
                str(self.root / "helper.sqlite"),
                self.identity("helper"),
                helper_listen,
                data_port=helper_data_port,
            ),
            party,
        )
        await self.helper.start()
        self.helper_port = self.helper.port
        self.leader = SvtaggServer(
            ServerConfig(
                Role.LEADER,
                str(self.root / "leader.sqlite"),
                self.identity("leader"),
                f"127.0.0.1:{self.leader_port}",
                helper_address=self.helper_addr,
            ),
            party,
        )
        await self.leader.start()
        self.leader_port = self.leader.port

    async def stop(self) -> None:
        for s in (self.leader, self.helper):
            if s is not None:
                await s.stop(0.5)
        self.leader = self.helper = None

    # -- blocking clients, run off the event loop ------------------------------------
    def uploader(self, **kw: Any) -> Any:
        from svtagg.client.upload import Uploader

        c = self.identity("client")
        return Uploader(self.leader_addr, self.helper_addr, c.ca, c.cert, c.key, **kw)

    def analyst_stub(self, role: str = "analyst") -> Any:
        import grpc

        from svtagg.proto import svtagg_pb2_grpc as pb_grpc
        from svtagg.proto.tls import tls_target

        ident = self.identity(role)
        creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
        return pb_grpc.AnalystStub(
            grpc.secure_channel(self.leader_addr, creds, options=tls_target("leader"))
        )

    def oracle(self, task_id: str) -> Any:
        from svtagg.analyst.remote_oracle import RemoteOracle

        return RemoteOracle.from_certs(self.leader_addr, task_id, self.certs)


@contextlib.asynccontextmanager
async def ingest_port_pair(certs: Path, root: Path) -> AsyncIterator[tuple[SvtaggServer, ...]]:
    """(leader, helper) in this process, each also serving Ingest on its
    `ingest_port` to clients holding no certificate (--ingest-listen)."""
    ident = {r: Identity.load(certs, r) for r in ("leader", "helper")}
    helper = SvtaggServer(
        ServerConfig(
            Role.HELPER, str(root / "h.sqlite"), ident["helper"], ingest_listen="127.0.0.1:0"
        )
    )
    await helper.start()
    try:
        leader = SvtaggServer(
            ServerConfig(
                Role.LEADER,
                str(root / "l.sqlite"),
                ident["leader"],
                helper_address=f"127.0.0.1:{helper.port}",
                ingest_listen="127.0.0.1:0",
            )
        )
        await leader.start()
        try:
            yield leader, helper
        finally:
            await leader.stop(0.5)
    finally:
        await helper.stop(0.5)


async def off_loop(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await asyncio.to_thread(fn, *args, **kw)


@pytest.fixture
async def deployment(certs: Path, tmp_path: Path) -> AsyncIterator[Deployment]:
    dep = Deployment(certs, tmp_path)
    await dep.start()
    try:
        yield dep
    finally:
        with contextlib.suppress(Exception):
            await dep.stop()


def make_task(
    stub: Any,
    task_id: str = "t1",
    d: int = 8,
    n_max: int = 100_000,
    min_batch: int = 1,
    eps_total: str = "10",
    delta_total: str = "1/1000",
    eps_min: str = "1/100",
    frac_bits: int = 16,
) -> Any:

    return stub.CreateTask(
        pb.TaskSpec(
            task_id=task_id,
            d=d,
            frac_bits=frac_bits,
            n_max=n_max,
            min_batch=min_batch,
            epsilon_total=eps_total,
            delta_total=delta_total,
            epsilon_min=eps_min,
        ),
        timeout=10,
    )


@pytest.fixture
def svc_rng() -> Iterator[np.random.Generator]:
    """Seeded data generator for the service tests (named to avoid clashing)."""
    yield np.random.default_rng(20261130)


# ---------------------------------------------------------------- process harness
# Shared by the reliability, hostile-input, auth and load tests: leader and
# helper as subprocesses (svtagg.deploy.launch.LocalDeployment) that a test can
# arm to SIGKILL themselves at a crash point (svtagg.servers.faults), and a
# read-only look at a server's SQLite store: the test-only way to check that the
# two servers' share sums add up to the plaintext sum (no RPC ever reveals them).


class ProcessDeployment:
    """Leader + helper processes with run-time crash arming and store views."""

    def __init__(
        self,
        root: Path,
        server_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        from svtagg.deploy.launch import UNCAPPED_SERVER_ARGS, LocalDeployment

        self.root = root
        self.env = dict(env or {})
        self.control = {r: root / f"{r}.crash" for r in ("leader", "helper")}
        # The suites create tasks with large budgets: lift the default caps (a
        # test of the caps passes its own, which come later and win).
        args = UNCAPPED_SERVER_ARGS + list(server_args or [])
        self.dep = LocalDeployment(root, server_args=args)
        self.kills: dict[str, int] = {}

    def start_role(self, role: str) -> None:
        self.control[role].write_text("")
        self.dep.start_role(role, env={**self.env, "SVTAGG_CRASH_CONTROL": str(self.control[role])})

    def start(self) -> ProcessDeployment:
        self.start_role("helper")
        self.start_role("leader")
        return self

    def stop(self) -> None:
        self.dep.stop()

    @property
    def certs(self) -> Path:
        return self.dep.certs

    def address(self, role: str) -> str:
        return self.dep.address(role)

    def identity(self, role: str) -> Identity:
        return Identity.load(self.certs, role)

    def arm(self, role: str, point: str) -> None:
        self.control[role].write_text(point)

    def await_kill(self, role: str, timeout: float = 30.0) -> int:
        """Wait for `role` to die at its armed point; returns the exit status (-9)."""
        proc = self.dep.procs.pop(role)
        rc = proc.wait(timeout)
        self.kills[role] = self.kills.get(role, 0) + 1
        return rc

    def restart(self, role: str) -> None:
        self.start_role(role)

    def channel(self, role: str = "analyst", server: str = "leader") -> Any:
        """A mutual-TLS channel to `server`, holding the certificate of `role`."""
        import grpc

        from svtagg.proto.tls import tls_target
        from svtagg.proto.vocab import CHANNEL_OPTIONS as OPTIONS

        ident = self.identity(role)
        creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
        return grpc.secure_channel(
            self.address(server), creds, options=[*OPTIONS, *tls_target(server)]
        )

    def stub(self, role: str = "analyst", service: str = "Analyst", server: str = "leader") -> Any:
        from svtagg.proto import health_pb2_grpc
        from svtagg.proto import svtagg_pb2_grpc as pb_grpc

        module = health_pb2_grpc if service == "Health" else pb_grpc
        return getattr(module, f"{service}Stub")(self.channel(role, server))

    def uploader(self, **kw: Any) -> Any:
        from svtagg.client.upload import Uploader

        c = self.identity("client")
        return Uploader(self.address("leader"), self.address("helper"), c.ca, c.cert, c.key, **kw)

    def oracle(self, task_id: str) -> Any:
        from svtagg.analyst.remote_oracle import RemoteOracle

        return RemoteOracle.from_certs(self.address("leader"), task_id, self.certs)

    def store_view(self, role: str, task_id: str) -> StoreView:
        return store_view(self.root / f"{role}.sqlite", task_id)


@contextlib.contextmanager
def running(root: Path, server_args: list[str] | None = None) -> Iterator[ProcessDeployment]:
    """A started `ProcessDeployment` under `root`, stopped on the way out (for a
    module fixture: `with running(tmp_path_factory.mktemp(name)) as d: yield d`)."""
    d = ProcessDeployment(root, server_args).start()
    try:
        yield d
    finally:
        d.stop()


from svtagg.benchmarks.storeview import StoreView, encoded_sum, store_view  # noqa: E402,F401

# ---------------------------------------------------------------- PostgreSQL
# The PostgreSQL cases run against the server named by SVTAGG_TEST_POSTGRES
# (`.ci/run` starts one with scripts/start_postgres.sh) and skip without it,
# except in CI (CI=true), where a missing server fails the run: silently
# skipped store tests would pass CI without testing the PostgreSQL store.

PG_ENV = "SVTAGG_TEST_POSTGRES"
_pg_reason: list[str | None] = []


def postgres_unavailable() -> str | None:
    """Why the PostgreSQL cases cannot run (None: they can); asked once."""
    if not _pg_reason:
        import os

        url = os.environ.get(PG_ENV)
        reason: str | None = None
        if not url:
            reason = f"{PG_ENV} is not set (scripts/start_postgres.sh starts a server)"
        else:
            try:
                import psycopg

                psycopg.connect(url, connect_timeout=5).close()
            except ImportError:
                reason = 'psycopg is not installed (pip install -e ".[postgres]")'
            except Exception as e:  # noqa: BLE001 - any failure to connect means skip
                reason = f"PostgreSQL at {PG_ENV} is unreachable: {str(e).strip()[:200]}"
        _pg_reason.append(reason)
    return _pg_reason[0]


@contextlib.contextmanager
def pg_tagged() -> Iterator[tuple[str, str]]:
    """(URL, tag) of the test server: the caller names its schemas `<x>_<tag>`,
    and every schema so named is dropped afterwards.  Skips without a server."""
    import os
    import uuid

    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    url, tag = os.environ[PG_ENV], uuid.uuid4().hex[:12]
    try:
        yield url, tag
    finally:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            names = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE right(nspname, %s) = %s",
                (len(tag) + 1, f"_{tag}"),
            ).fetchall()
            for (name,) in names:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_url() -> Iterator[tuple[str, str]]:
    """`pg_tagged` for one test."""
    with pg_tagged() as found:
        yield found


def _in_ci() -> bool:
    import os

    return os.environ.get("CI", "").lower() == "true"


def pytest_sessionstart(session: pytest.Session) -> None:
    import os
    import tempfile

    # The front door's upload journals (`Deployment.upload`) go to a throwaway
    # directory, never the user's ~/.local/state.
    if not os.environ.get("SVTAGG_STATE_DIR"):
        os.environ["SVTAGG_STATE_DIR"] = tempfile.mkdtemp(prefix="svtagg-state-")
    if _in_ci():
        reason = postgres_unavailable()
        if reason:
            pytest.exit(f"CI=true and the PostgreSQL store tests cannot run: {reason}", 1)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Only when a PostgreSQL case asked (no connection attempt for other runs).
    if _pg_reason and _pg_reason[0]:
        terminalreporter.write_line(f"PostgreSQL tests skipped: {_pg_reason[0]}")


def spy_joint_sampler(monkeypatch: pytest.MonkeyPatch, garbler_only: bool) -> list[np.ndarray]:
    """Hook the servers' joint-noise sampler (`servers.exchange.joint`): each draw appends
    the Z that the garbling server's own random words alone would give (its best
    guess, `plain_joint_noise` of its words; the servers' dither is off, see
    `joint_z`); with `garbler_only` the evaluating
    server's words are zero — the control where one server's randomness is all
    that enters the sampler.  Returns the list the guesses go to."""
    from svtagg.dp.noise import RandomSource
    from svtagg.mpc import jointnoise
    from svtagg.mpc.jointnoise import SamplerShape, plain_joint_noise
    from svtagg.servers.exchange import joint as server_joint

    guesses: list[np.ndarray] = []
    real_garble, real_evaluate = jointnoise.garble_joint_noise, jointnoise.evaluate_joint_noise
    # No dither, so the pair's draw is exactly 2^F·Z − 2^(F−1) (`joint_z` undoes it).
    monkeypatch.setattr(server_joint, "_dither", lambda n, shift: np.zeros(n, dtype=np.uint64))

    async def garble(party: Any, n: int, shape: SamplerShape, u: Any = None) -> Any:
        u = RandomSource().u64(shape.words * n).reshape(shape.words, n)
        guesses.append(plain_joint_noise(u, shape))
        return await real_garble(party, n, shape, u)

    async def evaluate(party: Any, n: int, shape: SamplerShape, v: Any = None) -> Any:
        if garbler_only:
            v = np.zeros((shape.words, n), dtype=np.uint64)
        return await real_evaluate(party, n, shape, v)

    monkeypatch.setattr(server_joint, "garble_joint_noise", garble)
    monkeypatch.setattr(server_joint, "evaluate_joint_noise", evaluate)
    return guesses


def joint_sum(pair: Any, stream_id: str, a: Any, b: Any) -> np.ndarray:
    """The joint noise two servers' shares `a`, `b` of a stream make, as int64:
    the shares are exact mod 2^w only, w the stream's comparison width (the
    comparison reads the low w bits; `mpc.jointnoise.SamplerShape.width`), so
    the sum is read as a signed w-bit number."""
    core = pair.leader.core
    stream = core.stream(stream_id)
    w = core.comparison_width(core.task(stream.task_id), stream)
    x = np.atleast_1d(np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64))
    if w == 64:
        return x.view(np.int64)
    v = (x & np.uint64((1 << w) - 1)).astype(np.int64)
    return np.where(v >= 1 << (w - 1), v - (1 << w), v)


def joint_z(grid: np.ndarray, frac_bits: int) -> np.ndarray:
    """The Z of draws made without dither (`spy_joint_sampler`): 2^F·Z − 2^(F−1)."""
    return (np.asarray(grid, dtype=np.int64) + (1 << (frac_bits - 1))) >> frac_bits


def joint_guess_bound(frac_bits: int, kind: str = "lap24", epsilon: str = "1") -> float:
    """How often a server may name a joint ν (of a `kind` stream at `epsilon`)
    from its own bits and still count as not predicting it: four times the
    chance that two independent draws coincide (Σ p²), plus a margin of 0.005."""
    from fractions import Fraction

    from svtagg.dp.joint import pmf
    from svtagg.dp.jointsvt import joint_stream_noise
    from svtagg.dp.kinds import StreamKind

    noise = joint_stream_noise(StreamKind(kind), Fraction(epsilon), frac_bits)
    law = pmf(noise.query_constants, noise.query_widths, noise.signed).values()
    collision = float(sum(p * p for p in law))
    return 4 * collision + 0.005


async def helper_accepts_open(ot_extension: str) -> tuple[bytes, object]:
    """A helper session's `accept` of a leader's SessionOpen naming `ot_extension`
    (the helper's own from SVTAGG_OT or the default): (session id, None), or the
    refusal it raises."""
    from svtagg.servers.exchange.session import HelperSession

    frames = [pb.PeerFrame(open=pb.SessionOpen(session_id=b"s" * 16, ot_extension=ot_extension))]

    async def read() -> pb.PeerFrame | None:
        return frames.pop(0) if frames else None

    async def write(frame: pb.PeerFrame) -> None:
        return None

    return await HelperSession(write, read).accept(None)
