"""Client SDK: embed per-user records, encode, share with seed compression, and
upload to both servers in batches.

Each report has one 16-byte id used on both servers: random, or — for an
upload that can be resumed (`UploadKey`) — derived with its share seed from a
secret per-upload key and the report's row number, so sending a row again
sends the very same report.  A batch is stored atomically by each server, and a
retry resends the *same* batch (same ids), so a retry after a lost answer is
refused as a replay (ALREADY_EXISTS) instead of counted twice; the SDK reads
that refusal on a retry, and for keyed batches always, as "already held".  The
leader receives the explicit shares, the helper only seeds.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from svtagg.client.embeddings import EMBEDDINGS
from svtagg.client.records import (
    InputError,
    ReadStats,
    check_circuit,
    check_grid,
    check_range,
)
from svtagg.mpc.ring import encode
from svtagg.mpc.sharing import SEED_BYTES, share
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import tls_target
from svtagg.proto.vocab import (
    CALL_DEADLINE,
    CHANNEL_OPTIONS,
    MAX_BATCH_REPORTS,
    MAX_BATCH_VALUES,
    MAX_MESSAGE_BYTES,
    MAX_VERIFY_BYTES,
    REPORT_ID_BYTES,
)
from svtagg.vdaf.circuits import MeasurementError
from svtagg.vdaf.validity import Validity, ValidityError, parse_validity

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: A block of an upload's rows: values in [0, 1]^d (m × d), or for a crawl
#: task strings as B-bit integers (`client.strings.encode_string`).
Rows = npt.NDArray[np.float64] | list[int]


@dataclass(frozen=True)
class UploadKey:
    """The secret of one resumable upload: row r's report id and share seed are
    keyed BLAKE2b (a PRF) of r under it, with distinct personalisations.  The
    servers see the ids and (the helper) the seeds, never the key, and no PRF
    output tells anything of another, so the leader learns nothing of a seed.
    Keep the key as secret as the input: with it, the leader's shares give the
    values.  A row sent again must be the same row (`client.journal` checks the
    input); should it differ all the same, its seed differs too (`seed`), since
    one seed under two values would hand the leader their difference."""

    secret: bytes

    @classmethod
    def new(cls) -> UploadKey:
        return cls(secrets.token_bytes(32))

    def _prf(self, what: bytes, msg: bytes, size: int) -> bytes:
        return hashlib.blake2b(msg, key=self.secret, person=what, digest_size=size).digest()

    def report_id(self, row: int) -> bytes:
        return self._prf(b"svtagg-report-id", row.to_bytes(8, "big"), REPORT_ID_BYTES)

    def seed(self, row: int, encoded: npt.NDArray[np.uint64]) -> bytes:
        """Row `row`'s seed, bound to its encoded value as well as its number: if
        the row's value differs when it is sent again (an input rewritten between
        the journal's check and the read), the seed differs too, so the two
        explicit shares the leader may see are masked by independent pads and
        tell nothing of the difference (the resent report is then junk, which
        the robust aggregates bound like any other report)."""
        msg = row.to_bytes(8, "big") + np.ascontiguousarray(encoded, dtype="<u8").tobytes()
        return self._prf(b"svtagg-seed", msg, SEED_BYTES)

    def prio3_rand(self, row: int, encoded: npt.NDArray[np.uint64], size: int) -> bytes:
        """Row `row`'s Prio3 sharding randomness (seeds, blinds, proof randomness),
        bound to its value as `seed` is, so a row sent again is the same report."""
        msg = row.to_bytes(8, "big") + np.ascontiguousarray(encoded, dtype="<u8").tobytes()
        out = b""
        for block in range(-(-size // 64)):
            out += self._prf(b"svtagg-prio3-%d" % block, msg, 64)
        return out[:size]

    def crawl_rand(self, row: int, value: int, size: int) -> bytes:
        """Row `row`'s DPF key randomness for a crawl task's string (its B-bit
        integer `value`), bound to the value as `seed` is."""
        msg = row.to_bytes(8, "big") + value.to_bytes(32, "big")
        out = b""
        for block in range(-(-size // 64)):
            out += self._prf(b"svtagg-crawl-%d" % block, msg, 64)
        return out[:size]


@dataclass(frozen=True)
class Batch:
    """Reports ready to send: the leader's and the helper's halves of one batch.
    `keyed`: ids and shares derive from an `UploadKey`, so a server that refuses
    the batch as a replay holds this very batch (from an earlier run)."""

    leader: pb.UploadBatch
    helper: pb.UploadBatch
    keyed: bool = False
    #: Prio3 reports (a task with a validity circuit): the helper must hold
    #: them before the leader verifies them with it, so it is sent first.
    proofs: bool = False

    def __len__(self) -> int:
        return len(self.leader.reports)


def make_batch(
    task_id: str,
    values: npt.ArrayLike,
    frac_bits: int,
    key: UploadKey | None = None,
    first_row: int = 0,
    validity: Validity | None = None,
) -> Batch:
    """Encode an m × d block of per-user values in [0, 1] and share each row;
    with `key`, the rows are rows first_row, first_row + 1, ... of that upload
    and their ids and seeds are the key's (else fresh random ones).  For a task
    with a validity circuit (`validity`), each row becomes a Prio3 report with
    its proof (`svtagg.vdaf.validity.Validity.shard`)."""
    rows = encode(np.atleast_2d(np.asarray(values, dtype=np.float64)), frac_bits)
    if validity is not None:
        return _proof_batch(task_id, rows, validity, key, first_row)
    lead, help_ = pb.UploadBatch(task_id=task_id), pb.UploadBatch(task_id=task_id)
    for i, row in enumerate(rows, first_row):
        if key is None:
            rid, (explicit, seed) = os.urandom(REPORT_ID_BYTES), share(row)
        else:
            rid, (explicit, seed) = key.report_id(i), share(row, key.seed(i, row))
        lead.reports.add(report_id=rid, explicit_share=explicit.astype("<u8").tobytes())
        help_.reports.add(report_id=rid, seed=seed)
    return Batch(lead, help_, keyed=key is not None)


def _proof_batch(
    task_id: str,
    rows: npt.NDArray[np.uint64],
    validity: Validity,
    key: UploadKey | None,
    first_row: int,
) -> Batch:
    if key is None:
        ids = [os.urandom(REPORT_ID_BYTES) for _ in range(len(rows))]
        rands = None
    else:
        size = validity.rand_size
        numbers = range(first_row, first_row + len(rows))
        ids = [key.report_id(i) for i in numbers]
        rands = [key.prio3_rand(i, row, size) for i, row in zip(numbers, rows, strict=True)]
    try:
        shards = validity.shard(rows, ids, rands)
    except MeasurementError as exc:  # e.g. two categories under onehot
        # Name the row (1-based, of the upload's rows); callers that read a
        # file check every row first (`client.records.check_circuit`).
        check_grid(rows, validity, first_row + 1)
        raise InputError(f"a row does not fit the task's validity circuit: {exc}") from None
    return _report_batch(task_id, ids, shards, key is not None)


def _report_batch(
    task_id: str, ids: Sequence[bytes], shards: Sequence[tuple[bytes, bytes, bytes]], keyed: bool
) -> Batch:
    """Reports with a public share and one input share per server, which the
    helper must hold before the leader checks them with it (`Batch.proofs`)."""
    lead, help_ = pb.UploadBatch(task_id=task_id), pb.UploadBatch(task_id=task_id)
    for rid, (public, leader, helper) in zip(ids, shards, strict=True):
        lead.reports.add(report_id=rid, input_share=leader, public_share=public)
        help_.reports.add(report_id=rid, input_share=helper, public_share=public)
    return Batch(lead, help_, keyed=keyed, proofs=True)


def make_string_batch(
    task_id: str,
    values: Sequence[int],
    validity: Validity,
    key: UploadKey | None = None,
    first_row: int = 0,
) -> Batch:
    """A crawl task's reports (validity crawl:B) of strings as B-bit integers
    (`client.strings.encode_string`): per string, the incremental DPF's public
    share and one key per server (`Validity.shard_strings`), the report id its
    nonce.  With `key`, the strings are rows first_row, first_row + 1, ... of
    that upload and their ids and randomness are the key's."""
    if not validity.crawl:
        raise InputError(f"strings go to a crawl task (validity crawl:B), not {validity.name}")
    for i, v in enumerate(values):
        if not 0 <= int(v) < 1 << validity.bits:
            raise InputError(f"row {first_row + i + 1}: not a string of {validity.bits} bits")
    numbers = range(first_row, first_row + len(values))
    if key is None:
        ids = [os.urandom(REPORT_ID_BYTES) for _ in numbers]
        rands = None
    else:
        size = validity.rand_size
        ids = [key.report_id(i) for i in numbers]
        rands = [key.crawl_rand(i, int(v), size) for i, v in zip(numbers, values, strict=True)]
    shards = validity.shard_strings([int(v) for v in values], ids, rands)
    return _report_batch(task_id, ids, shards, key is not None)


@dataclass
class UploadStats:
    #: Reports in the batches this run delivered (including batches a server
    #: refused as already held: `stored` says what was new).
    reports: int = 0
    batches: int = 0
    retries: int = 0
    seconds: float = 0.0
    #: The servers' answers' n, as they give it: 0 where a server withholds the
    #: task's count from clients (or answered "already held"), so never a count
    #: of this upload; `held` and `stored` are.
    n_leader: int = 0
    n_helper: int = 0
    errors: list[str] = field(default_factory=list)
    #: Rows of this upload each server (leader, helper) has acknowledged holding,
    #: counted as each answer arrives: after an interrupt, what each one stores.
    held: list[int] = field(default_factory=lambda: [0, 0])
    #: Of those, the rows each server stored on this run's calls (the others it
    #: held already, from an earlier run or a retried call whose answer was lost).
    stored: list[int] = field(default_factory=lambda: [0, 0])
    #: Reports the servers refused for a failed validity proof, by reason.
    rejected: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Resumable:
    """What makes `Uploader.upload_blocks` resumable: the upload's key, the row
    its blocks start at, and `acknowledged`, called after each batch both
    servers hold (to record it, as `client.journal` does)."""

    key: UploadKey
    first_row: int = 0
    acknowledged: Callable[[UploadStats], None] | None = None


class UploadError(Exception):
    """A batch was refused (not retryable) or retries ran out.  `unreachable`: the
    last failure was a server that could not be reached (not a refusal)."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


__all__ = [
    "InputError",
    "ReadStats",
    "Resumable",
    "UploadError",
    "UploadKey",
    "UploadStats",
    "Uploader",
    "batch_bound",
    "make_batch",
    "make_string_batch",
]


#: A batch in flight: its futures, the servers it goes to, the helper's n once known.
_InFlight = tuple["Batch", dict[int, Future[Any]], tuple[int, ...], int]

#: Channels of uploads a Ctrl-C cut short (see `Uploader.__exit__`).
_ABANDONED: list[grpc.Channel] = []


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

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # After Ctrl-C the interrupt may have landed inside a gRPC call, and
        # closing the channel — or merely deallocating it — can then wait for
        # that call for ever (gRPC's Python channel, grpc/grpc#19973 and kin):
        # the process is ending, so the channels are kept referenced and left
        # to it (the command line ends without finalizing them, deploy/cli.entry).
        if exc_type is None or issubclass(exc_type, Exception):
            self.close()
        else:
            _ABANDONED.extend(self._channels)

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
        which: tuple[int, ...] = (0, 1),
    ) -> tuple[int, int]:
        """Deliver one batch to the servers in `which` (waiting on `futures` if it
        was already submitted); returns their n afterwards (0 if the batch had
        been stored by an earlier attempt whose answer was lost).  Prio3 reports
        go to the helper first, then to the leader, which verifies them there."""
        stats = stats if stats is not None else UploadStats()
        if not batch.proofs:
            return self._deliver(batch, stats, futures or self._submit(batch, which))
        ns = [0, 0]
        held = dict(futures or {})
        for i in (1, 0):  # the helper's half first
            if i in which:
                sent: dict[int, Future[Any]] = (
                    {i: held[i]} if i in held else self._submit(batch, (i,))
                )
                ns[i] = self._deliver(batch, stats, sent)[i]
        return ns[0], ns[1]

    def _to_leader(self, inflight: _InFlight, stats: UploadStats) -> _InFlight:
        """Prio3 reports in flight: once the helper holds them, hand the leader
        its half at once, so that the leader verifies this batch while the
        client shards the next (the helper's answer is usually already there)."""
        batch, futures, which, n_helper = inflight
        if not batch.proofs or 1 not in futures:
            return inflight
        n_helper = self._deliver(batch, stats, {1: futures[1]})[1]
        rest = tuple(i for i in which if i != 1)
        return batch, self._submit(batch, rest), rest, n_helper

    def _deliver(
        self, batch: Batch, stats: UploadStats, futures: dict[int, Future[Any]]
    ) -> tuple[int, int]:
        """Wait for the submitted calls, resubmitting those that may be retried."""
        ns = [0, 0]
        attempt = 0
        while True:
            retry: list[int] = []
            for i, fut in futures.items():
                try:
                    result = fut.result()
                    ns[i] = int(result.n)
                    stats.held[i] += len(batch)
                    stats.stored[i] += len(batch)
                    for reason, count in result.rejected.items():
                        stats.rejected[reason] = stats.rejected.get(reason, 0) + int(count)
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    if code == grpc.StatusCode.ALREADY_EXISTS and (attempt > 0 or batch.keyed):
                        # stored by an earlier attempt or run (batches are atomic)
                        stats.held[i] += len(batch)
                        continue
                    if code not in RETRYABLE or attempt >= self.retries:
                        server = "leader" if i == 0 else "helper"
                        verb = "could not be reached" if code in RETRYABLE else "refused the batch"
                        raise UploadError(
                            f"{server} {verb}: {code.name}: {exc.details()}",  # type: ignore[attr-defined]
                            unreachable=code in RETRYABLE,
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

        Values outside [0, 1], NaN and inf, and for a task with a validity
        circuit rows it does not take, are refused (`InputError`, naming the
        row and column) before anything is sent.  Batches hold at most
        `batch_size` reports and never more than the task takes (`batch_bound`).
        require_validation: refuse (ValueError) a task that does not range-check
        its reports — a client's own protection against a task set up so that a
        malicious client could reverse comparisons (docs/threat-model.md)."""
        if isinstance(values, list | tuple) and values and isinstance(values[0], str):
            raise InputError("strings are uploaded to a crawl task with upload_strings")
        matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
        if matrix.ndim != 2:
            raise InputError(f"expected an n x d matrix, got shape {matrix.shape}")
        check_range(matrix, 0.0, 1.0, 1, "values must lie in [0, 1]", False, ReadStats())
        info = self.checked_task(task_id, require_validation)
        if _is_crawl(info.spec):
            raise InputError(
                f"task {task_id!r} is a crawl task (validity {info.spec.validity}): its "
                "clients upload strings, with upload_strings"
            )
        if matrix.shape[1] != info.spec.d:
            raise InputError(f"rows have {matrix.shape[1]} values, task has d={info.spec.d}")
        validity = task_circuit(info.spec)
        if validity is not None:
            check_circuit(matrix, validity, 1)
        size = min(batch_size, batch_bound(info.spec))
        return self.upload_blocks(
            task_id, _blocks(matrix, size), total=matrix.shape[0], progress=progress, info=info
        )

    def upload_strings(
        self,
        task_id: str,
        strings: Iterable[str],
        *,
        batch_size: int = 1000,
        progress: Callable[[int, int], None] | None = None,
    ) -> UploadStats:
        """Upload one string per user to a crawl task (validity crawl:B), each
        as a report of an incremental verifiable DPF (helper first, then the
        leader, which checks its first level with the helper at ingest).

        Every string is checked before anything is sent: one that is not a
        str, longer than B/8 bytes in UTF-8 or holding NUL is refused
        (`InputError` naming its row, 1-based).  Random report ids and no
        journal, as `upload`; `upload_blocks(..., resume=...)` with blocks of
        `client.strings.encode_strings` gives a resumable upload."""
        from svtagg.client.strings import STRINGS_FORMAT, check_strings_upload, encode_strings

        if isinstance(strings, str | bytes):
            raise InputError("upload_strings takes a list of strings (one per user), not one")
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        info = self.checked_task(task_id, False)
        bits = check_strings_upload(info.spec, STRINGS_FORMAT, None)
        values = encode_strings(strings, bits)
        if not values:
            raise InputError("no strings to upload")
        size = min(batch_size, batch_bound(info.spec))
        blocks = [values[i : i + size] for i in range(0, len(values), size)]
        return self.upload_blocks(task_id, blocks, total=len(values), progress=progress, info=info)

    def checked_task(
        self,
        task_id: str,
        require_validation: bool,
        embedding: str | None = None,
        info: pb.TaskInfo | None = None,
    ) -> pb.TaskInfo:
        """The task's info (`info`, else asked for), refusing a task that does not
        validate when asked to, and — when the task records its embedding — an
        upload embedded otherwise (`embedding`: the upload's, "vectors" for rows
        already in [0,1]^d)."""
        info = info if info is not None else self.task(task_id)
        if require_validation and not info.spec.validity:
            raise ValueError(
                f"task {task_id!r} takes reports without a validity proof; refusing to upload"
            )
        recorded = info.spec.embedding
        if embedding is not None and recorded and recorded != embedding:
            raise InputError(
                f"task {task_id!r} records embedding {recorded}; this upload is {embedding} "
                f"(use --embedding {recorded})"
                if recorded != "vectors"
                else f"task {task_id!r} takes rows in [0,1]^d (vectors); this upload is {embedding}"
            )
        return info

    def upload_blocks(
        self,
        task_id: str,
        blocks: Iterable[Rows],
        *,
        total: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        require_validation: bool = False,
        info: pb.TaskInfo | None = None,
        resume: Resumable | None = None,
        stats: UploadStats | None = None,
    ) -> UploadStats:
        """Upload blocks of rows (each m × d, values in [0, 1]) as they come: memory
        holds two blocks, not the input.  A block larger than the task takes
        (`batch_bound`) is sent in pieces of that size; a resumable upload must
        cut its rows the same way on every run (a batch is held or not as a
        whole), so `client.cli` sizes its blocks itself.  A block of the wrong
        width or with values outside [0, 1] raises InputError; blocks sent
        before it stay uploaded (`stats` says how many, also after an
        interrupt).  With `resume` the blocks are the upload's rows from its
        `first_row` on, and a batch a server already holds counts as held there.
        A crawl task's blocks are lists of strings as B-bit integers
        (`client.strings.encode_strings`), each sent as `make_string_batch`."""
        info = info if info is not None else self.checked_task(task_id, require_validation)
        validity = task_circuit(info.spec)
        most = batch_bound(info.spec)
        stats = stats if stats is not None else UploadStats()
        key = resume.key if resume is not None else None
        acknowledged = resume.acknowledged if resume is not None else None
        row = resume.first_row if resume is not None else 0
        start = time.perf_counter()
        # Pipelined: the next batch is encoded and shared while this one is in flight.
        inflight: _InFlight | None = None
        for block in _with_end(_pieces(blocks, most)):
            if inflight is not None:
                inflight = self._to_leader(inflight, stats)
            batch = None
            if block is not None:
                batch = _batch_of(task_id, block, info.spec, validity, key, row)
                row += len(batch)
                # On a resume, a server that acknowledged these rows is not asked again.
                which = tuple(i for i in (0, 1) if key is None or stats.held[i] < row)
            if inflight is not None:
                done, futures, sent_to, n_h = inflight
                got = self.send(done, stats, futures, sent_to)
                n_l, n_h = got[0], got[1] or n_h
                stats.reports += len(done)
                stats.batches += 1
                stats.n_leader, stats.n_helper = n_l or stats.n_leader, n_h or stats.n_helper
                if acknowledged is not None:
                    acknowledged(stats)
                if progress is not None:
                    progress(stats.reports, total if total is not None else -1)
            if batch is not None:
                # Prio3 reports: only the helper's half goes ahead (the leader's waits for it).
                ahead = tuple(i for i in which if i == 1 or not batch.proofs)
                inflight = (batch, self._submit(batch, ahead), which, 0)
            else:
                inflight = None
        stats.seconds = time.perf_counter() - start
        return stats


def _batch_of(
    task_id: str,
    block: Rows,
    spec: pb.TaskSpec,
    validity: Validity | None,
    key: UploadKey | None,
    row: int,
) -> Batch:
    """One block's batch: strings for a crawl task, rows of [0, 1]^d otherwise."""
    if validity is not None and validity.crawl:
        if isinstance(block, np.ndarray):
            raise InputError(
                f"task {task_id!r} is a crawl task (validity {spec.validity}): its reports are "
                "strings, not rows of numbers"
            )
        return make_string_batch(task_id, block, validity, key, row)
    if not isinstance(block, np.ndarray) or block.ndim != 2 or block.shape[1] != int(spec.d):
        width = block.shape[-1] if isinstance(block, np.ndarray) else "no"
        raise InputError(f"rows have {width} values, task has d={spec.d}")
    return make_batch(task_id, block, spec.frac_bits, key, row, validity)


def _is_crawl(spec: pb.TaskSpec) -> bool:
    validity = task_circuit(spec)
    return validity is not None and validity.crawl


def batch_bound(spec: pb.TaskSpec) -> int:
    """The most reports one upload batch of the task may hold: what the servers
    take (`MAX_BATCH_REPORTS` reports, `MAX_BATCH_VALUES` values) in one message
    (`MAX_MESSAGE_BYTES`), and for a task with a validity circuit what its
    reports' size allows (`Validity.batch_limit`, the servers' own rule).
    InputError if not even one report fits: no client can upload to the task."""
    d = int(spec.d)
    validity = task_circuit(spec)
    if validity is not None:
        most = validity.batch_limit(MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES)
    else:
        # The leader's half: d little-endian uint64 and an id per report.
        most = min(MAX_BATCH_REPORTS, (MAX_MESSAGE_BYTES - 4096) // (8 * d + 64))
    most = min(most, MAX_BATCH_VALUES // d)
    if most < 1:
        proofs = f" with {spec.validity} proofs" if spec.validity else ""
        raise InputError(
            f"task {spec.task_id!r}: one report of d={d:,}{proofs} is more than one upload "
            f"batch may hold (the servers take {MAX_MESSAGE_BYTES >> 20} MiB per message and "
            f"{MAX_VERIFY_BYTES >> 20} MiB to verify a batch): no client can upload to it"
        )
    return most


def task_circuit(spec: pb.TaskSpec) -> Validity | None:
    """The validity circuit a task's reports prove (None: plain shares)."""
    try:
        return parse_validity(spec.validity, spec.d, spec.frac_bits, spec.embedding)
    except ValidityError as exc:
        raise InputError(f"task {spec.task_id!r}: {exc} (a newer server? upgrade svtagg)") from None


def _pieces(blocks: Iterable[Rows], most: int) -> Iterator[Rows]:
    """The blocks, each cut into pieces of at most `most` rows."""
    for block in blocks:
        if (not isinstance(block, np.ndarray) or block.ndim == 2) and len(block) > most:
            yield from (block[i : i + most] for i in range(0, len(block), most))
        else:
            yield block


def _with_end(blocks: Iterable[Rows]) -> Iterator[Rows | None]:
    yield from blocks
    yield None


def _blocks(matrix: npt.NDArray[np.float64], size: int) -> Iterator[npt.NDArray[np.float64]]:
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    for start in range(0, matrix.shape[0], size):
        yield matrix[start : start + size]


def load_records(path: str | Path) -> npt.NDArray[Any]:
    """Per-user records from .npy (any shape) or CSV (one user per line, numbers),
    read whole; for uploads of any size `client.records.read_input` streams and
    checks instead."""
    p = Path(path)
    if p.suffix == ".npy":
        return np.load(p, allow_pickle=False)
    data = np.loadtxt(p, delimiter=",", ndmin=2)
    return data


def embed(
    records: npt.ArrayLike, embedding: str | None, *, fmt: str | None = None, **params: Any
) -> npt.NDArray[np.float64]:
    """Apply a named embedding from `client.embeddings.EMBEDDINGS` (None: the
    records already are vectors in [0, 1]^d).  heavy_hitters takes `fmt`
    "categories" (a list of category ids per user, with `d`) or "matrix" (a 0/1
    matrix); nothing is guessed from the shape."""
    if embedding is None:
        return np.asarray(records, dtype=np.float64)
    if embedding not in EMBEDDINGS:
        raise ValueError(f"unknown embedding {embedding!r}; known: {', '.join(EMBEDDINGS)}")
    if embedding == "heavy_hitters":
        if fmt == "categories":
            if "d" not in params:
                raise InputError("heavy_hitters with fmt='categories' needs d")
            d = int(params["d"])
            rows: list[Any] = list(records.tolist() if isinstance(records, np.ndarray) else records)  # type: ignore[arg-type]
            ids: list[list[int]] = []
            for i, row in enumerate(rows, 1):
                cats = [int(v) for v in row]
                if cats != list(row) or any(not 0 <= c < d for c in cats):
                    raise InputError(f"row {i}: category ids must be integers in [0, {d})")
                ids.append(cats)
            return EMBEDDINGS[embedding](ids, d)
        if fmt != "matrix":
            raise InputError(
                "heavy_hitters needs fmt='categories' (category ids per user) or 'matrix' (0/1)"
            )
        arr = np.asarray(records, dtype=np.float64)
        if "d" in params and arr.shape[-1] != int(params["d"]):
            raise InputError(f"rows have {arr.shape[-1]} values, d={params['d']}")
        if not ((arr == 0) | (arr == 1)).all():
            raise InputError("a heavy_hitters matrix holds only 0 and 1")
        return arr
    return EMBEDDINGS[embedding](records, **params)
