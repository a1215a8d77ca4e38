"""Ingest with validity proofs against the old garbled range check, side by side
in one run: what a client spends proving a report, what the two servers spend
verifying and folding it, what each server stores per report, and what a client
uploads per report.

    python -m svtagg.benchmarks.bench_ingest                  # 10,000 reports per instance
    python -m svtagg.benchmarks.bench_ingest --quick          # 1,000 reports, for a smoke test
    python -m svtagg.benchmarks.bench_ingest --reports N [--batch B] [--gc-reports M]
                                             [--no-processes] [--instances LIST]

Instances (default; F = 16): Prio3 with the `range` circuit at d = 100, with
`onehot` and with `multihot:10` at d = 1,000; and, for comparison, plain shares
at d = 100 checked by the old defence, a garbled range check at the close (2d
sign tests of full width per report, ORed per report: `any_per_group` of the
mpc layer, garbler and evaluator in this one process over a MemoryChannel).
`--instances` names others as circuit@d[/F], e.g. range@10000/8,onehot@10000,
sparse-onehot@10000, sparse-multihot:10@10000 or sparse-range:10@10000/16 (each
instance's batches at most what the servers' batch rule allows it);
the targets are marked only on the instances they name.

- client: `Validity.shard` on blocks of B rows, as the client's upload shards
  a batch; ms per report, median [min–max] over the blocks (the plain column:
  `mpc.sharing.share` per row).
- servers, reference pair: `ReferencePair.send_proofs` per batch of B reports
  already sharded (the helper keeps them pending, the leader verifies the batch
  with it, both fold; the plain column: `store_reports`, nothing checked);
  reports/s, median [min–max] over the batches, the process's CPU per report,
  and the verification's bytes between the servers per report.  Both servers
  run in this one process, serially.  Then the close: seconds and bytes
  between the servers, per task.
- servers, two processes: a `LocalDeployment` (leader and helper processes,
  mutual TLS, SQLite), the same sharded batches sent with `Uploader.send`
  (helper first, then the leader, which verifies with the helper); reports/s
  over the batches and each server process's CPU per report (/proc).
- storage: growth of each server's SQLite store (database file + WAL + the
  `.shares` directory) from just after the task's creation, per report, after
  the upload and after the close: as the files stand, after a WAL checkpoint
  (TRUNCATE), and that without the file's free pages.
- upload: the encoded lengths a client sends each server per report, and the
  protobuf message (`UploadBatch`) per report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from svtagg.benchmarks.storeview import store_view
from svtagg.client.upload import Batch, Uploader
from svtagg.deploy.jobs import analyst_stub
from svtagg.deploy.launch import LocalDeployment
from svtagg.deploy.tasks import task_spec
from svtagg.dp.task import TaskSpec, safe_epsilon_min
from svtagg.mpc import native as mpc_native
from svtagg.mpc.protocol import connected_pair
from svtagg.mpc.ring import U64, encode, sensitivity
from svtagg.mpc.sharing import expand_seed, share
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.terms import MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES
from svtagg.proto.tls import Identity
from svtagg.proto.vocab import REPORT_ID_BYTES
from svtagg.servers.edge.wire import VERIFY
from svtagg.servers.reference import reference_pair
from svtagg.vdaf import native as vdaf_native
from svtagg.vdaf.validity import Validity, parse_validity

Stat = tuple[float, float, float]  # median, min, max
#: One report as a client sends it: (public share, leader's share, helper's
#: share); plain shares have no public share (b"") and the helper's is a seed.
Shard = tuple[bytes, bytes, bytes]

FRAC_BITS = 16
TASK_ID = "ingest"
#: Lanes per garbled validation chunk, as the servers ran the old check (2d
#: lanes per report, so 250 reports per chunk at d = 100).
GC_LANES = 50_000
#: The targets, for the instances they name ((circuit, d, F); "plain": the old
#: check's rate): client ms per report (≤), servers reports/s (≥); and bytes
#: stored per report per server (≤), for every instance.
CLIENT_MS = {("range", 100, 16): 5.0, ("onehot", 1000, 16): 0.5}
SERVER_RATE = {("range", 100, 16): 5_000.0, ("onehot", 1000, 16): 20_000.0}
GC_RATE = {("plain", 100, 16): 5_000.0}
STORAGE_BYTES = 100.0


@dataclass(frozen=True)
class Instance:
    """One column: a validity circuit ("" = plain shares) at dimension d."""

    label: str
    validity: str
    d: int
    frac_bits: int = FRAC_BITS

    @property
    def circuit(self) -> Validity | None:
        return parse_validity(self.validity, self.d, self.frac_bits)

    def batch(self, most: int) -> int:
        """Rows per block and batch: `most`, or fewer where the servers' batch
        rule allows fewer reports of this circuit (`Validity.batch_limit`, as
        the SDK sizes its batches)."""
        v = self.circuit
        if v is None:
            return most
        return min(most, v.batch_limit(MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, MAX_VERIFY_BYTES))

    @property
    def kind(self) -> str:
        """The circuit's name without the weight bound ("plain" for none)."""
        return self.validity.split(":")[0] or "plain"

    def target(self, targets: dict[tuple[str, int, int], float]) -> float | None:
        return targets.get((self.kind, self.d, self.frac_bits))


def parse_instance(text: str) -> Instance:
    """An instance from `circuit@d[/F]` (circuit: any validity circuit but
    crawl:B, or plain), e.g. range@10000/8, onehot@1000, sparse-range:10@10000,
    plain@100."""
    name, _, size = text.partition("@")
    d_text, _, f_text = size.partition("/")
    d, frac_bits = int(d_text), int(f_text or FRAC_BITS)
    validity = "" if name == "plain" else name
    label = f"{'plain+GC' if name == 'plain' else name} d={d}"
    if frac_bits != FRAC_BITS:
        label += f" F={frac_bits}"
    inst = Instance(label, validity, d, frac_bits)
    inst.circuit  # noqa: B018 - refuses a name that does not parse
    return inst


def _stat(xs: Sequence[float]) -> Stat:
    return statistics.median(xs), min(xs), max(xs)


def valid_values(inst: Instance, m: int, seed: int = 0) -> npt.NDArray[np.float64]:
    """m rows a client may send (values in [0, 1]): uniform for `range` and
    plain shares, one 1 per row for `onehot`, exactly r ones (the most
    allowed) per row for `multihot:r`."""
    gen = np.random.default_rng(seed)
    if inst.kind in ("range", "plain"):
        return gen.random((m, inst.d))
    v = inst.circuit
    assert v is not None
    ones = 1 if v.one_item else v.max_weight
    out = np.zeros((m, inst.d))
    for row in out:
        row[gen.choice(inst.d, size=ones, replace=False)] = 1.0
    return out


# ------------------------------------------------------------------ the client
@dataclass
class Sharded:
    """Reports ready to send, and the client's time per report of each block."""

    ids: list[bytes]
    shards: list[Shard]
    ms_per_report: list[float]

    def __len__(self) -> int:
        return len(self.ids)


def shard_reports(inst: Instance, values: npt.NDArray[np.float64], block: int) -> Sharded:
    """Shard the rows as a client does, a block of `block` rows at a time:
    `Validity.shard` of the block (the plain column: `share` per row).  A first
    small block, untimed, builds the circuit and warms caches."""
    grid = encode(np.atleast_2d(values), inst.frac_bits)
    v = inst.circuit

    def run(rows: U64, ids: list[bytes]) -> list[Shard]:
        if v is not None:
            return v.shard(rows, ids)
        out = []
        for row in rows:
            explicit, seed = share(row)
            out.append((b"", explicit.astype("<u8").tobytes(), seed))
        return out

    run(grid[:2], [os.urandom(REPORT_ID_BYTES) for _ in grid[:2]])
    out = Sharded([], [], [])
    for lo in range(0, len(grid), block):
        rows = grid[lo : lo + block]
        ids = [os.urandom(REPORT_ID_BYTES) for _ in rows]
        t = time.perf_counter()
        shards = run(rows, ids)
        out.ms_per_report.append((time.perf_counter() - t) / len(rows) * 1e3)
        out.ids += ids
        out.shards += shards
    return out


# ------------------------------------------------------------------ upload bytes
def upload_batch(inst: Instance, ids: Sequence[bytes], shards: Sequence[Shard]) -> Batch:
    """The protobuf batches a client sends for these reports (client/upload.py)."""
    lead, help_ = pb.UploadBatch(task_id=TASK_ID), pb.UploadBatch(task_id=TASK_ID)
    for rid, (public, leader, helper) in zip(ids, shards, strict=True):
        if inst.validity:
            lead.reports.add(report_id=rid, input_share=leader, public_share=public)
            help_.reports.add(report_id=rid, input_share=helper, public_share=public)
        else:
            lead.reports.add(report_id=rid, explicit_share=leader)
            help_.reports.add(report_id=rid, seed=helper)
    return Batch(lead, help_, proofs=bool(inst.validity))


def upload_bytes(inst: Instance, data: Sharded) -> dict[str, float]:
    """Bytes per report a client sends: to the leader its share + the public
    share + the id, to the helper likewise (the largest over the reports, whose
    lengths are fixed by the circuit), and the protobuf batch per report."""
    ids = REPORT_ID_BYTES
    sample = min(len(data), 100)  # lengths are fixed per circuit: a sample's message will do
    batch = upload_batch(inst, data.ids[:sample], data.shards[:sample])
    return {
        "leader": max(len(ld) + len(p) + ids for p, ld, _ in data.shards),
        "helper": max(len(h) + len(p) + ids for p, _, h in data.shards),
        "public": max(len(p) for p, _, _ in data.shards),
        "pb_leader": batch.leader.ByteSize() / sample,
        "pb_helper": batch.helper.ByteSize() / sample,
    }


# ------------------------------------------------------------------ storage
def footprint(db: Path) -> int:
    """Bytes of one SQLite store: the database file, its WAL and the
    `.shares` directory (the per-report shares' side files)."""
    total = 0
    for p in (db, Path(f"{db}-wal")):
        if p.exists():
            total += p.stat().st_size
    side = Path(f"{db}.shares")
    if side.is_dir():
        total += sum(f.stat().st_size for f in side.iterdir() if f.is_file())
    return total


def checkpoint(db: Path) -> int:
    """Move the WAL into the database file and truncate it (the store's own
    connection stays open; nothing is read or changed); returns the bytes of
    the file's free pages (pages of deleted rows, kept for reuse: SQLite does
    not shrink a file without VACUUM)."""
    con = sqlite3.connect(db, timeout=30)
    try:
        busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        page = con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()
    if busy:
        raise RuntimeError(f"the WAL checkpoint of {db} was blocked")
    return int(free) * int(page)


@dataclass
class Storage:
    """Bytes per report on one server, after the upload ("open") and after the
    close ("closed"), each as (files as they stand, after a WAL checkpoint,
    the same without the free pages)."""

    open: tuple[float, float, float] = (0.0, 0.0, 0.0)
    closed: tuple[float, float, float] = (0.0, 0.0, 0.0)


# ------------------------------------------------------------------ servers
def reference_spec(inst: Instance, n_max: int) -> TaskSpec:
    eps_min = str(safe_epsilon_min(n_max, inst.frac_bits))
    return TaskSpec(
        TASK_ID, inst.d, inst.frac_bits, n_max, 1, "10", "0", eps_min, False, "", inst.validity
    )


@dataclass
class ServerRun:
    """The reference pair's figures for one instance."""

    rate: Stat
    cpu_ms: float
    storage: dict[str, Storage]
    n: tuple[int, int]
    #: Bytes of the batches' verification between the servers, per report (the
    #: Verify call and its answer as the wire encodes them, without framing).
    peer_bytes: float = 0.0
    #: The close (field-to-ring or robust pass over the d sums, agreement):
    #: wall seconds and bytes between the servers, per task.
    close_s: float = 0.0
    close_bytes: int = 0


async def reference_run(inst: Instance, root: Path, data: Sharded, batch: int) -> ServerRun:
    """Send the sharded reports through the one-process reference pair in
    batches of `batch`, timing each `send_proofs` (plain: `store_reports`),
    then close; storage measured around both."""
    dbs = {"leader": root / "l.sqlite", "helper": root / "h.sqlite"}
    rates: list[float] = []
    cpu = 0.0
    peer = [0, 0]  # the verification's bytes, everything's bytes

    def tap(what: str, name: str, data: bytes) -> None:
        peer[1] += len(data)
        if name == VERIFY.name:
            peer[0] += len(data)

    async with reference_pair(root, frac_bits=inst.frac_bits, tap=tap) as ref:
        await ref.leader.create_task(reference_spec(inst, max(len(data), 1000)))
        base_free = {role: checkpoint(db) for role, db in dbs.items()}
        base = {role: footprint(db) for role, db in dbs.items()}
        for lo in range(0, len(data), batch):
            ids, shards = data.ids[lo : lo + batch], data.shards[lo : lo + batch]
            t, c = time.perf_counter(), time.process_time()
            if inst.validity:
                got = await ref.send_proofs(TASK_ID, ids, shards)
                if got.accepted != len(ids):
                    raise RuntimeError(f"valid reports refused: {got.rejected}")
            else:
                ref.store_reports(
                    TASK_ID,
                    [(r, ld) for r, (_, ld, _) in zip(ids, shards, strict=True)],
                    [(r, h) for r, (_, _, h) in zip(ids, shards, strict=True)],
                )
            rates.append(len(ids) / (time.perf_counter() - t))
            cpu += time.process_time() - c
        n = len(data)
        peer_bytes = peer[0] / n

        def measure() -> dict[str, tuple[float, float, float]]:
            out = {}
            for role, db in dbs.items():
                raw = footprint(db) - base[role]
                free = checkpoint(db) - base_free[role]
                kept = footprint(db) - base[role]
                out[role] = (raw / n, kept / n, (kept - free) / n)
            return out

        opened = measure()
        before, t = peer[1], time.perf_counter()
        await ref.leader.close_collection(TASK_ID)
        close_s, close_bytes = time.perf_counter() - t, peer[1] - before
        closed = measure()
        stor = {role: Storage(opened[role], closed[role]) for role in dbs}
        counts = (ref.leader.core.task(TASK_ID).n, ref.helper.core.task(TASK_ID).n)
    return ServerRun(_stat(rates), cpu / n * 1e3, stor, counts, peer_bytes, close_s, close_bytes)


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessRun:
    """Two server processes: reports/s over the batches, CPU ms per report of
    each server process, and each server's n at the end."""

    rate: Stat
    cpu_ms: dict[str, float]
    n: tuple[int, int]


def process_run(inst: Instance, data: Sharded, batch: int) -> ProcessRun:
    """The same sharded reports through a leader and a helper process."""
    batches = [
        upload_batch(inst, data.ids[lo : lo + batch], data.shards[lo : lo + batch])
        for lo in range(0, len(data), batch)
    ]
    with LocalDeployment() as dep:
        analyst_stub(dep.address("leader"), dep.certs).CreateTask(
            task_spec(TASK_ID, inst.d, max(len(data), 1000), "10", validity=inst.validity),
            timeout=30,
        )
        ident = Identity.load(dep.certs, "client")
        pids = {role: dep.procs[role].pid for role in ("leader", "helper")}
        before = {role: _proc_cpu(pid) for role, pid in pids.items()}
        rates = []
        with Uploader(
            dep.address("leader"), dep.address("helper"), ident.ca, ident.cert, ident.key
        ) as up:
            for b in batches:
                t = time.perf_counter()
                up.send(b)
                rates.append(len(b) / (time.perf_counter() - t))
        cpu = {
            role: (_proc_cpu(pid) - before[role]) / len(data) * 1e3 for role, pid in pids.items()
        }
        # each server's n from its store (the helper's Upload answers before
        # the batch is verified, so its n there lags one batch)
        ns = (
            store_view(dep.root / "leader.sqlite", TASK_ID).n,
            store_view(dep.root / "helper.sqlite", TASK_ID).n,
        )
    return ProcessRun(_stat(rates), cpu, ns)


# ------------------------------------------------------------------ the old check
def gc_lanes(grid: U64, frac_bits: int = FRAC_BITS) -> tuple[U64, U64]:
    """Both servers' lanes of the old range check for plain reports of these
    grid rows (m × d), as the servers formed them from the stored shares: per
    report 2d lanes, first −v − 1 for each of its values v (its sign test says
    v < 0), then v − 2^F − 1 for each (v > 2^F)."""
    m, d = grid.shape
    lead, helper = np.empty((m, d), np.uint64), np.empty((m, d), np.uint64)
    for i, row in enumerate(grid):
        explicit, seed = share(row)
        lead[i], helper[i] = explicit, expand_seed(seed, d)
    return gc_lanes_of(lead, helper, sensitivity(frac_bits))


def gc_lanes_of(lead: U64, helper: U64, top: int) -> tuple[U64, U64]:
    """The lanes from the leader's explicit shares and the helper's expanded
    seeds (m × d each); `top` = 2^F."""
    z_l = np.concatenate([~lead, lead - np.uint64(top + 1)], axis=1)
    z_h = np.concatenate([~helper + np.uint64(1), helper], axis=1)
    return z_l.reshape(-1), z_h.reshape(-1)


@dataclass
class GcRun:
    """The old check: reports/s over the chunks, bytes between the parties per
    report, and each report's bit (True: invalid)."""

    rate: Stat
    bytes_per_report: float
    invalid: list[bool]


async def gc_check(z_l: U64, z_h: U64, d: int, lanes: int = GC_LANES) -> GcRun:
    """Run the range check over these lanes (2d per report) in chunks of
    `lanes` lanes, garbler and evaluator in this process (base OTs done first,
    untimed)."""
    g, e = await connected_pair()
    group = 2 * d
    per_chunk = max(1, lanes // group) * group
    rates, traffic, bits = [], 0, []
    for lo in range(0, len(z_l), per_chunk):
        a, b = z_l[lo : lo + per_chunk], z_h[lo : lo + per_chunk]
        before = g.channel.bytes_sent + g.channel.bytes_received
        t = time.perf_counter()
        mine, theirs = await asyncio.gather(g.any_per_group(a, group), e.any_per_group(b, group))
        rates.append(len(a) // group / (time.perf_counter() - t))
        traffic += g.channel.bytes_sent + g.channel.bytes_received - before
        if mine != theirs:
            raise AssertionError("the parties disagree")
        bits += mine
    return GcRun(_stat(rates), traffic / len(bits), bits)


# ------------------------------------------------------------------ the table
@dataclass
class Column:
    """Everything measured for one instance."""

    inst: Instance
    client: Stat
    upload: dict[str, float]
    ref: ServerRun
    procs: ProcessRun | None = None
    gc: GcRun | None = None


def _mark(value: float, target: float | None, at_most: bool) -> str:
    if target is None:
        return ""
    ok = value <= target if at_most else value >= target
    return " met" if ok else " MISSED"


def _cell(s: Stat, digits: int) -> str:
    return f"{s[0]:,.{digits}f} [{s[1]:,.{digits}f}–{s[2]:,.{digits}f}]"


def rows(cols: Sequence[Column]) -> list[tuple[str, list[str], str]]:
    """(figure, one cell per column, target) for every line of the table."""
    out: list[tuple[str, list[str], str]] = []

    def add(name: str, cell: Callable[[Column], str], target: str = "") -> None:
        out.append((name, [cell(c) for c in cols], target))

    def client(c: Column) -> str:
        t = c.inst.target(CLIENT_MS)
        return _cell(c.client, 3) + _mark(c.client[0], t, True)

    def server(c: Column) -> str:
        t = c.inst.target(SERVER_RATE)
        return _cell(c.ref.rate, 0) + _mark(c.ref.rate[0], t, False)

    def procs(c: Column) -> str:
        if c.procs is None:
            return "not run"
        t = c.inst.target(SERVER_RATE)
        return _cell(c.procs.rate, 0) + _mark(c.procs.rate[0], t, False)

    def gc(c: Column) -> str:
        if c.gc is None:
            return "—"
        return _cell(c.gc.rate, 0) + _mark(c.gc.rate[0], c.inst.target(GC_RATE), False)

    add("client: proof (plain: sharing), ms/report", client, "≤ 5 range d=100; ≤ 0.5 onehot")
    add("servers, reference pair, reports/s", server, "≥ 5,000 range d=100; ≥ 20,000 onehot")
    add("  process CPU, ms/report (both servers)", lambda c: f"{c.ref.cpu_ms:.3f}")
    add("  verification bytes between servers/report", lambda c: f"{c.ref.peer_bytes:,.0f}")
    add("the close, reference pair, s (per task)", lambda c: f"{c.ref.close_s:.2f}")
    add("  the close, bytes between servers (per task)", lambda c: f"{c.ref.close_bytes:,}")
    add("servers, two processes, reports/s", procs, "as above")
    for role in ("leader", "helper"):

        def cpu(c: Column, r: str = role) -> str:
            return "—" if c.procs is None else f"{c.procs.cpu_ms[r]:.3f}"

        add(f"  {role} process CPU, ms/report", cpu)
    add("old GC range check, reports/s", gc, "≥ 5,000 (d=100)")
    add(
        "  GC bytes between servers per report",
        lambda c: "—" if c.gc is None else f"{c.gc.bytes_per_report:,.0f}",
    )
    for role in ("leader", "helper"):
        for when in ("open", "closed"):

            def stored(c: Column, r: str = role, w: str = when) -> str:
                raw, kept, used = getattr(c.ref.storage[r], w)
                return f"{raw:,.0f} / {kept:,.0f} / {used:,.0f}" + _mark(kept, STORAGE_BYTES, True)

            add(f"storage {role}, {when}: files/kept/used, B/report", stored, "≤ 100 (kept)")
    for role in ("leader", "helper"):

        def sent(c: Column, r: str = role) -> str:
            return f"{c.upload[r]:,.0f}"

        def framed(c: Column, r: str = role) -> str:
            return f"{c.upload['pb_' + r]:,.1f}"

        add(f"upload to the {role}, B/report", sent)
        add("  protobuf UploadBatch, B/report", framed)
    return out


def print_table(cols: Sequence[Column]) -> None:
    lines = rows(cols)
    name_w = max(len(n) for n, _, _ in lines) + 2
    widths = [
        max(len(c.inst.label), *(len(cells[i]) for _, cells, _ in lines)) + 2
        for i, c in enumerate(cols)
    ]
    head = "".join(f"{c.inst.label:>{w}}" for c, w in zip(cols, widths, strict=True))
    print(f"{'':<{name_w}}{head}  target")
    for name, cells, target in lines:
        body = "".join(f"{x:>{w}}" for x, w in zip(cells, widths, strict=True))
        print(f"{name:<{name_w}}{body}  {target}")


NOTES = """\
Notes:
- Cells: median [min–max] over the blocks (client), batches (servers) or
  garbled chunks (old check) of this run; "met"/"MISSED" against the target.
- The reference pair runs both servers in one process, one after the other
  (the helper's pending store, then the leader's preparation, the helper's
  verification and record, the leader's); two processes on 2 cores can at
  best halve that time.  The two-process row sends each batch helper-first,
  then to the leader, and waits for it before the next (no pipelining).
- Verification bytes: the leader's Verify call and the helper's answer as
  encoded (protobuf, without gRPC, HTTP/2 and TLS framing), per report.  The
  close: every message between the servers while the leader closes the task
  (with proofs: the field sums to ring shares and clamped, one garbled pass;
  plain: the robust pass over the ring sums; then the agreement), once per task.
- plain+GC: plain shares (no proof) stored as they come; they are checked only
  at the close, by the garbled range check (2d sign tests of width 64 per
  report, OR per report), measured with the mpc garbler/evaluator pair in
  this one process (base OTs untimed), {gc_lanes:,} lanes per chunk.
- Storage: growth of the SQLite store (database file + WAL + `.shares`)
  from just after the task's creation, per report.  "files": as they stand;
  "kept": after a WAL checkpoint (TRUNCATE; the WAL is a bounded window that
  does not grow with n); "used": kept less the file's free pages (pages of
  deleted rows, e.g. the helper's pending shares, which SQLite keeps for
  reuse).  The closed "files" figure holds only what the close wrote since
  the checkpoint before it.  Rows: the leader keeps per report its id (in
  `reports`, keyed by task id and report id); the helper its id and a 16-byte
  measurement seed (in `.shares`) until the agreement at the close drops the
  seeds; plain shares: the leader's 8·d-byte share and the helper's 16-byte
  seed in `.shares` until the agreement.  Per-task rows (sums, robust sums,
  verdicts until the close) are spread over n.
- Upload: leader = its input share + public share + 16-byte id (plain: 8·d
  bytes + id), helper = its input share + public share + id (plain: 16-byte
  seed + id); protobuf: the UploadBatch message per report (without gRPC,
  HTTP/2 and TLS framing)."""


def reference_all(
    cols: list[tuple[Instance, Sharded]], sizes: dict[str, int], root: Path
) -> list[ServerRun]:
    """Each instance through a reference pair of its own (one event loop each,
    so nothing of one pair outlives it)."""
    out = []
    for i, (inst, data) in enumerate(cols):
        where = root / str(i)
        where.mkdir()
        out.append(asyncio.run(reference_run(inst, where, data, sizes[inst.label])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=None, help="reports per instance")
    ap.add_argument("--quick", action="store_true", help="1,000 reports per instance")
    ap.add_argument("--batch", type=int, default=1000, help="rows per client block and batch")
    ap.add_argument(
        "--gc-reports", type=int, default=None, help="reports for the old check (0: skip it)"
    )
    ap.add_argument("--no-processes", action="store_true", help="skip the two-process run")
    ap.add_argument(
        "--instances",
        default="range@100,onehot@1000,multihot:10@1000,plain@100",
        help="comma-separated circuit@d[/F] (circuit: range, onehot, multihot[:r], "
        "sparse-onehot, sparse-multihot:r, plain)",
    )
    args = ap.parse_args(argv)
    n = args.reports or (1000 if args.quick else 10_000)
    batch = min(args.batch, 1000)
    if args.quick and args.reports is None:
        batch = min(batch, 200)
    gc_n = min(n, 2000) if args.gc_reports is None else args.gc_reports
    instances = [parse_instance(x) for x in args.instances.split(",") if x]
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"field core: {vdaf_native.describe()}; garbling core: {mpc_native.describe()}")
    sizes = {inst.label: inst.batch(batch) for inst in instances}
    print(
        f"{n:,} reports per instance, blocks and batches of {batch}"
        + "".join(f"; {k}: {b} (the servers' batch rule)" for k, b in sizes.items() if b < batch)
    )
    sharded = [
        (inst, shard_reports(inst, valid_values(inst, n), sizes[inst.label])) for inst in instances
    ]
    with tempfile.TemporaryDirectory(prefix="svtagg-ingest-") as tmp:
        refs = reference_all(sharded, sizes, Path(tmp))
    cols = []
    for (inst, data), ref in zip(sharded, refs, strict=True):
        if ref.n != (n, n):
            raise RuntimeError(f"{inst.label}: the servers hold {ref.n}, not {n} reports each")
        cols.append(Column(inst, _stat(data.ms_per_report), upload_bytes(inst, data), ref))
    for col, (inst, data) in zip(cols, sharded, strict=True):
        if not args.no_processes:
            col.procs = process_run(inst, data, sizes[inst.label])
        if not inst.validity and gc_n > 0:
            grid = encode(valid_values(inst, gc_n, seed=1), inst.frac_bits)
            col.gc = asyncio.run(gc_check(*gc_lanes(grid, inst.frac_bits), inst.d))
            if any(col.gc.invalid):
                raise RuntimeError("the old check flagged a valid report")
    print()
    print_table(cols)
    print()
    print(NOTES.format(gc_lanes=GC_LANES))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
