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
from svtagg.servers.core import PartyFactory, garbled_circuit_party
from svtagg.servers.service import ServerConfig, SvtaggServer
from svtagg.servers.tls import Identity, write_deployment

T = TypeVar("T")


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

    async def start(self, party: PartyFactory | None = None) -> None:
        """Start (or restart) both servers on their previous ports and stores."""
        party = party or engine()
        helper_listen = f"127.0.0.1:{self.helper_port}"
        self.helper = SvtaggServer(
            ServerConfig("helper", str(self.root / "helper.sqlite"), self.identity("helper"),
                         helper_listen),
            party,
        )
        await self.helper.start()
        self.helper_port = self.helper.port
        self.leader = SvtaggServer(
            ServerConfig("leader", str(self.root / "leader.sqlite"), self.identity("leader"),
                         f"127.0.0.1:{self.leader_port}", helper_address=self.helper_addr),
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
        from svtagg.servers.tls import tls_target

        ident = self.identity(role)
        creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
        return pb_grpc.AnalystStub(
            grpc.secure_channel(self.leader_addr, creds, options=tls_target("leader")))

    def oracle(self, task_id: str) -> Any:
        from svtagg.analyst.remote_oracle import RemoteOracle

        return RemoteOracle.from_certs(self.leader_addr, task_id, self.certs)


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
    from svtagg.proto import svtagg_pb2 as pb

    return stub.CreateTask(
        pb.TaskSpec(
            task_id=task_id, d=d, frac_bits=frac_bits, n_max=n_max, min_batch=min_batch,
            epsilon_total=eps_total, delta_total=delta_total, epsilon_min=eps_min,
        ),
        timeout=10,
    )


@pytest.fixture
def svc_rng() -> Iterator[np.random.Generator]:
    """Seeded data generator for the service tests (named to avoid clashing)."""
    yield np.random.default_rng(20261130)
