"""Client SDK: embed per-user records, encode, share with seed compression, and
upload to both servers in batches.

Each report gets one random 16-byte id used on both servers.  A batch is
stored atomically by each server, and a retry resends the *same* batch (same
ids), so a retry after a lost answer is refused as a replay (ALREADY_EXISTS)
instead of counted twice; the SDK reads that refusal on a retry as "already
delivered".  The leader receives the explicit shares, the helper only seeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from svtagg.client.embeddings import EMBEDDINGS
from svtagg.mpc.ring import encode
from svtagg.mpc.sharing import share
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import tls_target
from svtagg.proto.vocab import CALL_DEADLINE, CHANNEL_OPTIONS, MAX_BATCH_VALUES, REPORT_ID_BYTES

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass(frozen=True)
class Batch:
    """Reports ready to send: the leader's and the helper's halves of one batch."""

    leader: pb.UploadBatch
    helper: pb.UploadBatch

    def __len__(self) -> int:
        return len(self.leader.reports)


def make_batch(task_id: str, values: npt.ArrayLike, frac_bits: int) -> Batch:
    """Encode an m × d block of per-user values in [0, 1] and share each row."""
    rows = encode(np.atleast_2d(np.asarray(values, dtype=np.float64)), frac_bits)
    lead, help_ = pb.UploadBatch(task_id=task_id), pb.UploadBatch(task_id=task_id)
    for row in rows:
        rid = os.urandom(REPORT_ID_BYTES)
        explicit, seed = share(row)
        lead.reports.add(report_id=rid, explicit_share=explicit.astype("<u8").tobytes())
        help_.reports.add(report_id=rid, seed=seed)
    return Batch(lead, help_)


@dataclass
class UploadStats:
    reports: int = 0
    batches: int = 0
    retries: int = 0
    seconds: float = 0.0
    n_leader: int = 0
    n_helper: int = 0
    errors: list[str] = field(default_factory=list)


class UploadError(Exception):
    """A batch was refused (not retryable) or retries ran out."""


class Uploader:
    """Uploads reports to the leader and the helper (blocking API)."""

    def __init__(
        self,
        leader: str,
        helper: str,
        ca: bytes,
        cert: bytes | None = None,
        key: bytes | None = None,
        *,
        timeout: float = CALL_DEADLINE,
        retries: int = 5,
        backoff: float = 0.2,
    ) -> None:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        self._channels = [
            grpc.secure_channel(addr, creds, options=[*CHANNEL_OPTIONS, *tls_target(role)])
            for addr, role in ((leader, "leader"), (helper, "helper"))
        ]
        self._stubs = [pb_grpc.IngestStub(c) for c in self._channels]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> Uploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def task(self, task_id: str) -> pb.TaskInfo:
        """Public task parameters (d, frac_bits) as the leader states them."""
        info: pb.TaskInfo = self._stubs[0].GetTask(
            pb.TaskRef(task_id=task_id), timeout=self.timeout
        )
        return info

    def _submit(self, batch: Batch, which: tuple[int, ...] = (0, 1)) -> dict[int, Future[Any]]:
        msgs = (batch.leader, batch.helper)
        return {
            i: self._stubs[i].Upload.future(msgs[i], timeout=self.timeout)  # type: ignore[attr-defined]
            for i in which
        }

    def send(
        self,
        batch: Batch,
        stats: UploadStats | None = None,
        futures: dict[int, Future[Any]] | None = None,
    ) -> tuple[int, int]:
        """Deliver one batch to both servers (waiting on `futures` if it was already
        submitted); returns their n afterwards (0 if the batch had been stored by
        an earlier attempt whose answer was lost)."""
        stats = stats if stats is not None else UploadStats()
        futures = futures if futures is not None else self._submit(batch)
        ns = [0, 0]
        attempt = 0
        while True:
            retry: list[int] = []
            for i, fut in futures.items():
                try:
                    ns[i] = int(fut.result().n)
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    if code == grpc.StatusCode.ALREADY_EXISTS and attempt > 0:
                        continue  # stored by the earlier attempt (batches are atomic)
                    if code not in RETRYABLE or attempt >= self.retries:
                        server = "leader" if i == 0 else "helper"
                        raise UploadError(
                            f"{server} refused the batch: {code.name}: {exc.details()}"  # type: ignore[attr-defined]
                        ) from None
                    retry.append(i)
            if not retry:
                return ns[0], ns[1]
            attempt += 1
            stats.retries += 1
            time.sleep(self.backoff * 2 ** (attempt - 1))
            futures = self._submit(batch, tuple(retry))

    def upload(
        self,
        task_id: str,
        values: npt.ArrayLike,
        *,
        batch_size: int = 1000,
        progress: Callable[[int, int], None] | None = None,
        require_validation: bool = False,
    ) -> UploadStats:
        """Upload an n × d matrix of per-user values in [0, 1], one report per row.

        require_validation: refuse (ValueError) a task that does not range-check
        its reports — a client's own protection against a task set up so that a
        malicious client could reverse comparisons (docs/threat-model.md)."""
        info = self.task(task_id)
        if require_validation and not info.spec.validate_reports:
            raise ValueError(f"task {task_id!r} does not validate reports; refusing to upload")
        matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
        if matrix.shape[1] != info.spec.d:
            raise ValueError(f"rows have {matrix.shape[1]} values, task has d={info.spec.d}")
        # The servers refuse batches over MAX_BATCH_VALUES values (reports × d).
        batch_size = max(1, min(batch_size, MAX_BATCH_VALUES // info.spec.d))
        stats = UploadStats()
        start = time.perf_counter()
        total = matrix.shape[0]
        # Pipelined: the next batch is encoded and shared while this one is in flight.
        inflight: tuple[Batch, dict[int, Future[Any]]] | None = None
        for block in [*_blocks(matrix, batch_size), None]:
            batch = make_batch(task_id, block, info.spec.frac_bits) if block is not None else None
            if inflight is not None:
                done, futures = inflight
                n_l, n_h = self.send(done, stats, futures)
                stats.reports += len(done)
                stats.batches += 1
                stats.n_leader, stats.n_helper = n_l or stats.n_leader, n_h or stats.n_helper
                if progress is not None:
                    progress(stats.reports, total)
            inflight = (batch, self._submit(batch)) if batch is not None else None
        stats.seconds = time.perf_counter() - start
        return stats


def _blocks(matrix: npt.NDArray[np.float64], size: int) -> Iterator[npt.NDArray[np.float64]]:
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    for start in range(0, matrix.shape[0], size):
        yield matrix[start : start + size]


def load_records(path: str | Path) -> npt.NDArray[Any]:
    """Per-user records from .npy (any shape) or CSV (one user per line, numbers)."""
    p = Path(path)
    if p.suffix == ".npy":
        return np.load(p, allow_pickle=False)
    data = np.loadtxt(p, delimiter=",", ndmin=2)
    return data


def embed(records: npt.ArrayLike, embedding: str | None, **params: Any) -> npt.NDArray[np.float64]:
    """Apply a named embedding from `client.embeddings.EMBEDDINGS` (None: the
    records already are vectors in [0, 1]^d)."""
    if embedding is None:
        return np.asarray(records, dtype=np.float64)
    if embedding not in EMBEDDINGS:
        raise ValueError(f"unknown embedding {embedding!r}; known: {', '.join(EMBEDDINGS)}")
    if embedding == "heavy_hitters":
        arr = np.asarray(records)
        if "d" in params and arr.ndim == 2 and arr.shape[1] != int(params["d"]):
            # A column of category ids per user rather than a 0/1 matrix.
            return EMBEDDINGS[embedding](arr.astype(np.int64).tolist(), int(params["d"]))
        return EMBEDDINGS[embedding](arr, int(params.get("d") or arr.shape[-1]))
    return EMBEDDINGS[embedding](records, **params)
