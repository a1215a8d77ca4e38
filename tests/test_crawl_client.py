"""The prefix crawl's client and analyst sides without servers: the remote
level oracle's requests (walk id threading, parents as 32-byte big-endian
prefixes, depth and steps) and its refusals before any call, the answers'
bits unpacked; strings read from a file and refused by line; uploads of
strings (helper first, keyed reports, the journal) and the command line's
refusals (a format that does not fit the task, a line too long); the SDK's
`heavy_strings` and `svtagg analyst crawl` against a fake leader that answers
each level in the clear; `create-task` for a crawl task without --d; the
documented session parses."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from svtagg.analyst.crawl import crawl, encode_string
from svtagg.analyst.remote_crawl import (
    RemoteCrawlOracle,
    level_parents,
    pack_parents,
    unpack_above,
)
from svtagg.client.records import InputError, ReadStats
from svtagg.client.strings import decode_string, encode_strings, read_strings
from svtagg.client.upload import Uploader, make_string_batch
from svtagg.deploy import connection
from svtagg.deploy.cli import build_parser, main
from svtagg.deploy.connection import Deployment, TaskHandle, crawl_plan
from svtagg.dp.crawl import CrawlPlan
from svtagg.dp.errors import (
    BudgetExhausted,
    FailedPrecondition,
    InvalidArgument,
    Refusal,
)
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import REFUSAL_KEY
from svtagg.vdaf.validity import parse_validity

USAGE = 2
DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No settings from the environment or a config file; journals kept here."""
    monkeypatch.setenv("SVTAGG_CONFIG", "")
    monkeypatch.setenv("SVTAGG_STATE_DIR", str(tmp_path / "state"))
    for var in ("SVTAGG_LEADER", "SVTAGG_HELPER", "SVTAGG_CERTS"):
        monkeypatch.delenv(var, raising=False)


# ----------------------------------------------------------------- a fake leader


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, refusal: str = "") -> None:
        self._code, self._details, self._refusal = code, details, refusal

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((REFUSAL_KEY, self._refusal),) if self._refusal else ()


class CannedStub:
    """CrawlLevel answers from a list, recording each request."""

    def __init__(self, answers: list[pb.CrawlLevelResponse | Exception]) -> None:
        self.answers = list(answers)
        self.requests: list[pb.CrawlLevelRequest] = []

    def CrawlLevel(self, request: pb.CrawlLevelRequest, timeout: float) -> pb.CrawlLevelResponse:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def packed(bits: list[bool]) -> bytes:
    return np.packbits(np.array(bits, dtype=np.uint8), bitorder="little").tobytes()


def answer(walk_id: str, bits: list[bool], refused: int = 0) -> pb.CrawlLevelResponse:
    return pb.CrawlLevelResponse(
        walk_id=walk_id, stream_id=f"s{len(bits)}", candidates=len(bits), above=packed(bits),
        refused=refused, peer_bytes=1000,
    )  # fmt: skip


class ClearLeader:
    """A leader that holds strings in the clear and answers the Analyst calls a
    walk makes (DescribeTask, Budget, ListTasks, CrawlLevel) as the servers
    would without noise: a candidate is above τ when its count is.  Checks the
    requests as the leader does (servers/crawl.py: depth, parents a subset of
    the last level's candidates, ascending)."""

    def __init__(
        self, words: list[str], bits: int = 16, *, validity: str = "", open_: bool = False
    ) -> None:
        self.values = [encode_string(w, bits) for w in words]
        self.bits = bits
        self.validity = validity or f"crawl:{bits}"
        self.open = open_
        self.spent = Fraction(0)
        self.total = Fraction(10)
        self.walks: dict[str, tuple[int, list[int]]] = {}
        self.requests: list[pb.CrawlLevelRequest] = []
        self.created: list[pb.TaskSpec] = []

    def info(self) -> pb.TaskInfo:
        budget = pb.BudgetStatus(
            epsilon_total=str(self.total), epsilon_spent=str(self.spent), delta_total="0",
            delta_spent="0",
        )  # fmt: skip
        crawl_task = self.validity.startswith("crawl:")
        spec = pb.TaskSpec(
            task_id="words", d=1 if crawl_task else 10, frac_bits=16, n_max=1000,
            validity=self.validity, embedding="strings" if crawl_task else "",
        )  # fmt: skip
        return pb.TaskInfo(
            spec=spec, n=len(self.values), collection_open=self.open, budget=budget,
            helper_budget=budget,
        )  # fmt: skip

    def DescribeTask(self, request: pb.TaskRef, timeout: float) -> pb.TaskInfo:
        return self.info()

    def Budget(self, request: pb.TaskRef, timeout: float) -> pb.TaskInfo:
        return self.info()

    def GetTask(self, request: pb.TaskRef, timeout: float) -> pb.TaskInfo:
        return self.info()

    def ListTasks(self, request: pb.Empty, timeout: float) -> pb.TaskList:
        made = [pb.TaskInfo(spec=s) for s in self.created]
        return pb.TaskList(tasks=[self.info(), *made])

    def CreateTask(self, request: pb.TaskSpec, timeout: float) -> pb.TaskInfo:
        self.created.append(request)
        return self.info()

    def CrawlLevel(self, r: pb.CrawlLevelRequest, timeout: float) -> pb.CrawlLevelResponse:
        self.requests.append(r)
        if self.open:
            raise FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "collection open")
        depth, last = self.walks.get(r.walk_id, (0, [0])) if r.walk_id else (0, [0])
        parents = [
            int.from_bytes(r.parents[i : i + 32], "big") for i in range(0, len(r.parents), 32)
        ] or [0]
        assert r.depth == depth and set(parents) <= set(last) and parents == sorted(parents)
        assert 1 <= r.steps <= 8 and r.depth + r.steps <= self.bits
        eps = Fraction(r.epsilon)
        if self.spent + eps > self.total:
            raise FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "budget", "BudgetExhausted")
        self.spent += eps
        bits = r.depth + r.steps
        tally = Counter(v >> (self.bits - bits) for v in self.values)
        cands = [(p << r.steps) | x for p in parents for x in range(1 << r.steps)]
        above = [tally.get(c, 0) >= r.tau for c in cands]
        walk_id = r.walk_id or f"walk{len(self.walks) + 1}"
        self.walks[walk_id] = (bits, [c for c, a in zip(cands, above, strict=True) if a])
        return pb.CrawlLevelResponse(
            walk_id=walk_id, stream_id=f"st{len(self.requests)}", candidates=len(cands),
            above=packed(above), refused=1 if len(self.requests) == 1 else 0, peer_bytes=2048,
        )  # fmt: skip


# ----------------------------------------------------------------- the remote oracle


def test_a_walk_through_the_oracle_sends_the_levels_as_the_proto_says() -> None:
    ab = encode_string("ab", 16)
    level1 = [c == ord("a") or c == ord("c") for c in range(256)]
    level2 = [(ord("a") << 8 | x) == ab for x in range(256)] + [False] * 256
    stub = CannedStub([answer("w-1", level1, refused=2), answer("w-1", level2)])
    oracle = RemoteCrawlOracle(stub, "words", bits=16)
    result = crawl(oracle, CrawlPlan(16, 8, Fraction(1), 5, 4))
    assert result.strings() == ["ab"] and result.stopped == ""
    first, second = stub.requests
    assert (first.task_id, first.walk_id, first.parents, first.depth, first.steps) == (
        "words", "", b"", 0, 8,
    )  # fmt: skip
    assert (first.epsilon, first.tau) == ("1/2", 5)
    assert second.walk_id == "w-1" and second.depth == 8 and second.steps == 8
    assert second.parents == ord("a").to_bytes(32, "big") + ord("c").to_bytes(32, "big")
    assert len(second.parents) == 64
    st = oracle.stats
    assert st.levels == 2 and st.epsilon_spent == 1 and st.refused == 2
    assert st.refused_at == {1: 2, 2: 0} and st.peer_bytes == 2000
    assert st.stream_ids == ["s256", "s512"]


def test_a_short_last_level_and_a_stride_that_does_not_divide() -> None:
    plan = CrawlPlan(12, 8, Fraction(1), 3, 4)
    stub = CannedStub([answer("w", [c == 0x12 for c in range(256)]), answer("w", [True] * 16)])
    result = crawl(RemoteCrawlOracle(stub, "t", bits=12), plan)
    assert result.found == [(0x12 << 4) | x for x in range(16)]
    assert [r.steps for r in stub.requests] == [8, 4]
    assert stub.requests[1].parents == (0x12).to_bytes(32, "big")


def test_a_new_walk_at_level_one_and_levels_in_order() -> None:
    stub = CannedStub([answer("w1", [True, False]), answer("w2", [True, True])])
    oracle = RemoteCrawlOracle(stub, "t")
    assert oracle.above(1, [0, 1], 1, Fraction(1, 4), 1) == [True, False]
    with pytest.raises(InvalidArgument, match="does not follow"):
        oracle.above(3, [0, 1], 2, Fraction(1, 4), 1)
    assert oracle.above(1, [0, 1], 1, Fraction(1, 4), 1) == [True, True]  # a new walk
    assert [r.walk_id for r in stub.requests] == ["", ""]
    assert oracle.walk_id == "w2"


@pytest.mark.parametrize(
    ("level", "candidates", "prefix_bits", "message"),
    [
        (2, [0x100, 0x101], 16, "every extension"),  # a parent's children cut short
        (2, [(2 << 8) | x for x in range(256)] + [(1 << 8) | x for x in range(256)], 16,
         "ascending"),
        (2, [(1 << 8) | x for x in range(256)] + [(1 << 8) | x for x in range(256)], 16,
         "every extension"),  # a parent twice
        (2, list(range(256, 512))[::-1], 16, "every extension"),  # children out of order
        (2, [1 << 16], 16, "not a prefix of 16 bits"),
        (2, [1], 8, "1 to 8 bits"),  # no step
        (2, list(range(1 << 9)), 17, "1 to 8 bits"),  # more than 8 bits at once
        (2, [], 16, "at least one"),
        (1, list(range(255)), 8, "every extension"),  # the root's children cut short
    ],
)  # fmt: skip
def test_candidates_that_are_not_a_full_extension_are_refused_before_any_call(
    level: int, candidates: list[int], prefix_bits: int, message: str
) -> None:
    stub = CannedStub([answer("w", [True] * 256)])
    oracle = RemoteCrawlOracle(stub, "t", bits=32)
    if level == 2:
        oracle.above(1, list(range(256)), 8, Fraction(1), 1)
    with pytest.raises(InvalidArgument, match=message) as caught:
        oracle.above(level, candidates, prefix_bits, Fraction(1), 1)
    assert isinstance(caught.value, ValueError)
    assert len(stub.requests) == (level == 2)  # the refused level sent nothing
    assert oracle.stats.levels == (level == 2)


def test_other_refusals_before_any_call() -> None:
    stub = CannedStub([])
    oracle = RemoteCrawlOracle(stub, "t", bits=4)
    with pytest.raises(InvalidArgument, match="the strings have 4"):
        oracle.above(1, list(range(32)), 5, Fraction(1), 1)
    with pytest.raises(InvalidArgument, match="positive"):
        oracle.above(1, [0, 1], 1, Fraction(0), 1)
    with pytest.raises(InvalidArgument, match="2\\^64"):
        oracle.above(1, [0, 1], 1, Fraction(1), 1 << 64)
    assert stub.requests == []
    with pytest.raises(InvalidArgument, match="1 to 256"):
        RemoteCrawlOracle(stub, "t", bits=257)


def test_parents_and_bits_on_the_wire() -> None:
    assert pack_parents([1, 2**255]) == (1).to_bytes(32, "big") + (2**255).to_bytes(32, "big")
    assert level_parents([(5 << 2) | x for x in range(4)], 10, 2) == [5]
    bits = [True, False, False, True, True, False, True, False, True, True, False]
    assert unpack_above(packed(bits), len(bits)) == bits
    assert unpack_above(bytes([0b00000101]), 3) == [True, False, True]  # least significant first
    with pytest.raises(Refusal, match="3 bytes for 11"):
        unpack_above(packed(bits) + b"\0", 11)
    with pytest.raises(Refusal, match="1 bytes for 11"):
        unpack_above(packed(bits)[:1], 11)


def test_an_answer_that_does_not_fit_the_request_is_refused() -> None:
    for bad in (
        pb.CrawlLevelResponse(walk_id="w", candidates=3, above=b"\x01"),
        pb.CrawlLevelResponse(walk_id="", candidates=2, above=b"\x01"),
        pb.CrawlLevelResponse(walk_id="w", candidates=2, above=b"\x01\x00"),
    ):
        oracle = RemoteCrawlOracle(CannedStub([bad]), "t")
        with pytest.raises(Refusal):
            oracle.above(1, [0, 1], 1, Fraction(1), 1)
        assert oracle.walk_id == "" and oracle.stats.levels == 0


@pytest.mark.parametrize(
    ("code", "name", "expected"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "BudgetExhausted", BudgetExhausted),
        (grpc.StatusCode.FAILED_PRECONDITION, "", FailedPrecondition),
        (grpc.StatusCode.INVALID_ARGUMENT, "", InvalidArgument),
    ],
)
def test_grpc_failures_are_the_oracles_refusals(
    code: grpc.StatusCode, name: str, expected: type[Exception]
) -> None:
    stub = CannedStub([FakeRpcError(code, "no", name)])
    with pytest.raises(expected, match="no"):
        RemoteCrawlOracle(stub, "t").above(1, [0, 1], 1, Fraction(1), 1)


# ----------------------------------------------------------------- strings in files


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_strings_are_read_by_line(tmp_path: Path) -> None:
    p = write(tmp_path / "w.txt", "\ufeffthe\r\nüber\nof\n a b \nlast".encode())
    stats = ReadStats()
    blocks = list(read_strings(p, 64, batch=2, stats=stats))
    assert [len(b) for b in blocks] == [2, 2, 1] and stats.rows == 5
    assert [decode_string(v, 64) for b in blocks for v in b] == [
        "the",
        "über",
        "of",
        " a b ",
        "last",
    ]
    header = list(read_strings(write(tmp_path / "h.txt", b"word\nx\n"), 64, header=True))
    assert header == [[encode_string("x", 64)]]
    exactly = write(tmp_path / "e.txt", b"abcdefgh\r\nabcdefgh")
    assert len(next(read_strings(exactly, 64))) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"a\n\nb\n", "line 2 is blank"),
        (b"a\nb\n   \n", "line 3 is blank"),
        (b"a\nabcdefghi\n", "line 2: 'abcdefghi' is 9 bytes"),
        (b"a\nb\nabcdefghijklmnop\n", "line 3 is longer than 8 bytes"),
        (b"a\n\xff\xfe\n", "line 2 is not UTF-8"),
        (b"a\x00b\n", "line 1: 'a\\\\x00b' holds a NUL"),
        (b"", "no strings"),
    ],
)
def test_strings_a_task_cannot_hold_are_refused_by_line(
    tmp_path: Path, data: bytes, message: str
) -> None:
    p = write(tmp_path / "w.txt", data)
    with pytest.raises(InputError, match=message):
        list(read_strings(p, 64))


def test_strings_from_python_are_refused_by_row() -> None:
    assert encode_strings(["a", "b"], 16) == [encode_string("a", 16), encode_string("b", 16)]
    with pytest.raises(InputError, match="row 2: 'abc' is 3 bytes"):
        encode_strings(["a", "abc"], 16)
    with pytest.raises(InputError, match="row 3: int 7 is not a string"):
        encode_strings(["a", "b", 7], 16)
    # A blank string is refused from Python as a blank line is from a file:
    # the same rule for the front door and the command line.
    with pytest.raises(InputError, match="row 2 is blank"):
        encode_strings(["a", "  "], 16)
    with pytest.raises(InputError, match="row 1 is blank"):
        encode_strings([""], 16)
    with pytest.raises(InputError, match="not a whole number of bytes"):
        encode_strings(["a"], 12)


def test_a_batch_of_strings_is_keyed_and_shares_its_public_part() -> None:
    from svtagg.client.upload import UploadKey

    validity = parse_validity("crawl:32", 1, 16, "strings")
    assert validity is not None
    values = encode_strings(["ab", "cd"], 32)
    key = UploadKey.new()
    batch = make_string_batch("t", values, validity, key, first_row=5)
    again = make_string_batch("t", values, validity, key, first_row=5)
    assert batch.proofs and batch.keyed and len(batch) == 2
    assert batch.leader == again.leader and batch.helper == again.helper  # a resend is the same
    for lead, help_, row in zip(batch.leader.reports, batch.helper.reports, (5, 6), strict=True):
        assert lead.report_id == help_.report_id == key.report_id(row)
        assert lead.public_share == help_.public_share
        assert len(lead.public_share) == validity.public_share_bytes()
        assert lead.input_share != help_.input_share and len(lead.input_share) == 16
    fresh = make_string_batch("t", values, validity)
    assert (
        not fresh.keyed and fresh.leader.reports[0].report_id != batch.leader.reports[0].report_id
    )
    with pytest.raises(InputError, match="row 1: not a string of 32 bits"):
        make_string_batch("t", [1 << 32], validity)


# ----------------------------------------------------------------- uploads


class Sent:
    """Upload calls the fake servers received, in order: (server, batch)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, pb.UploadBatch]] = []

    def submit(self, batch: Any, which: tuple[int, ...] = (0, 1)) -> dict[int, Any]:
        out = {}
        for i in which:
            self.calls.append(("leader" if i == 0 else "helper", (batch.leader, batch.helper)[i]))
            fut: Future[pb.UploadResult] = Future()
            fut.set_result(pb.UploadResult(accepted=len(batch)))
            out[i] = fut
        return out


@pytest.fixture
def fake_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ClearLeader, Sent]]:
    """Clients reach a fake leader (GetTask) and fake Upload calls."""
    leader, sent = ClearLeader(["x"], 64), Sent()
    monkeypatch.setattr(Uploader, "task", lambda self, task_id: leader.info())
    monkeypatch.setattr(Uploader, "_submit", sent.submit)
    yield leader, sent


def upload_args(certs: Path, path: Path, *argv: str) -> list[str]:
    return [
        "client", "upload", "--leader", "127.0.0.1:9", "--helper", "127.0.0.1:10",
        "--certs", str(certs), "--task", "words", "--file", str(path), "--quiet", *argv,
    ]  # fmt: skip


def test_the_command_line_uploads_strings_helper_first_and_once(
    fake_servers: tuple[ClearLeader, Sent],
    certs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, sent = fake_servers
    words = tmp_path / "words.txt"
    words.write_text("the\nof\nand\nthe\nüber\n", encoding="utf-8")
    assert main(upload_args(certs, words, "--format", "strings", "--batch", "2", "--json")) == 0
    out = capsys.readouterr().out
    assert '"format": "strings"' in out and '"rows": 5' in out and '"batches": 3' in out
    assert [who for who, _ in sent.calls] == ["helper", "leader"] * 3
    ids = [r.report_id for who, b in sent.calls if who == "leader" for r in b.reports]
    assert len(ids) == len(set(ids)) == 5
    for _, b in sent.calls:
        assert all(r.public_share and r.input_share for r in b.reports)
    # The journal makes a rerun a refusal: nobody counts twice.
    assert main(upload_args(certs, words)) == USAGE
    assert "already uploaded" in capsys.readouterr().err
    assert len(sent.calls) == 6


@pytest.mark.parametrize(
    ("name", "content", "argv", "validity", "message"),
    [
        ("w.txt", "a\n", ["--format", "matrix"], "", "not format matrix"),
        ("w.txt", "a\n", ["--format", "categories"], "", "not format categories"),
        ("w.csv", "1,2\n", [], "", "not .csv input"),
        ("w.npy", "", [], "", "not .npy input"),
        ("w.txt", "a\n", ["--embedding", "heavy_hitters"], "", "not embedding heavy_hitters"),
        ("w.txt", "a\n", ["--clip"], "", "--clip: does not apply to strings"),
        ("w.txt", "a\n", ["--delimiter", ";"], "", "--delimiter: does not apply"),
        ("w.txt", "a\n", ["--format", "strings"], "range", "format strings is for a crawl task"),
        ("w.txt", "ok\nabcdefghi\n", [], "", "line 2: 'abcdefghi' is 9 bytes"),
        ("w.txt", "ok\nabcdefghij\n", [], "", "line 2 is longer than 8 bytes"),
        ("w.txt", "ok\n\nb\n", ["--format", "strings"], "", "line 2 is blank"),
        ("w.txt", "ok\n", [], "crawl:60", "not a whole number of bytes"),
    ],
)
def test_the_command_line_refuses_what_does_not_fit_the_task(
    fake_servers: tuple[ClearLeader, Sent],
    certs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str,
    argv: list[str],
    validity: str,
    message: str,
) -> None:
    leader, sent = fake_servers
    leader.validity = validity or leader.validity
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert main(upload_args(certs, path, *argv)) == USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sent.calls == [] and not list(tmp_path.glob("*.upload-*.json"))


def test_the_front_door_uploads_strings_to_a_crawl_task_only(
    fake_servers: tuple[ClearLeader, Sent], certs: Path
) -> None:
    leader, sent = fake_servers
    dep = Deployment("127.0.0.1:9", certs, helper="127.0.0.1:10")
    task = TaskHandle(dep, "words")
    stats = task.upload_strings(["the", "of", "the"], batch=2)
    assert stats.reports == 3 and stats.batches == 2 and stats.held == [3, 3]
    assert [who for who, _ in sent.calls] == ["helper", "leader"] * 2
    with pytest.raises(Refusal, match="already uploaded"):  # AlreadyExists: counted once
        task.upload_strings(["the", "of", "the"], batch=2)
    assert dep.upload("words", ["a"], journal=False).reports == 1  # fmt None: strings
    with pytest.raises(InputError, match="row 2: 'abcdefghi' is 9 bytes"):
        task.upload_strings(["a", "abcdefghi"])
    with pytest.raises(InputError, match="not one string"):
        task.upload_strings("the")
    with pytest.raises(InputError, match="not format matrix"):
        dep.upload("words", [[0.5]], fmt="matrix")
    leader.validity = "range"
    with pytest.raises(InputError, match="format strings is for a crawl task"):
        task.upload_strings(["a"])
    dep.close()


def test_the_client_sdk_uploads_strings_and_refuses_rows_of_numbers(
    fake_servers: tuple[ClearLeader, Sent], certs: Path
) -> None:
    leader, sent = fake_servers
    ca = (certs / "ca.pem").read_bytes()
    with Uploader("127.0.0.1:9", "127.0.0.1:10", ca) as up:
        stats = up.upload_strings("words", ["a", "b", "c"], batch_size=2)
        assert stats.reports == 3 and [who for who, _ in sent.calls] == ["helper", "leader"] * 2
        with pytest.raises(InputError, match="row 2: 'abcdefghi' is 9 bytes"):
            up.upload_strings("words", ["a", "abcdefghi"])
        with pytest.raises(InputError, match="is a crawl task"):
            up.upload("words", [[0.5]])
        with pytest.raises(InputError, match="upload_strings"):
            up.upload("words", ["a", "b"])
        leader.validity = "range"
        with pytest.raises(InputError, match="format strings is for a crawl task"):
            up.upload_strings("words", ["a"])
    assert len(sent.calls) == 4


# ----------------------------------------------------------------- the walk from the SDK

WORDS = ["ab"] * 30 + ["ac"] * 20 + ["b"] * 12 + ["zz"] * 2


@pytest.fixture
def clear_leader(monkeypatch: pytest.MonkeyPatch) -> ClearLeader:
    leader = ClearLeader(WORDS)
    monkeypatch.setattr(connection.pb_grpc, "AnalystStub", lambda channel: leader)
    return leader


def test_heavy_strings_walks_through_the_leader(clear_leader: ClearLeader, certs: Path) -> None:
    task = TaskHandle(Deployment("127.0.0.1:9", certs), "words")
    seen: list[int] = []
    result = task.heavy_strings(
        "2", stride=4, threshold=10, progress=lambda r: seen.append(r.level)
    )
    assert sorted(result.strings()) == ["ab", "ac", "b"]
    assert seen == [1, 2, 3, 4] and result.epsilon_spent == 2 and clear_leader.spent == 2
    assert [r.walk_id for r in clear_leader.requests] == ["", "walk1", "walk1", "walk1"]
    assert [(r.depth, r.steps, r.epsilon, r.tau) for r in clear_leader.requests] == [
        (0, 4, "1/2", 10), (4, 4, "1/2", 10), (8, 4, "1/2", 10), (12, 4, "1/2", 10),
    ]  # fmt: skip
    assert task.crawl_stats is not None and task.crawl_stats.refused == 1
    # The default threshold is the plan's false-positive floor.
    plan = crawl_plan(16, "2", 4, None, 64)
    assert plan.threshold > 1
    assert crawl_plan(16, "2", 4, 10, 64).threshold == 10


def test_heavy_strings_refuses_before_anything_is_spent(
    clear_leader: ClearLeader, certs: Path
) -> None:
    task = TaskHandle(Deployment("127.0.0.1:9", certs), "words")
    with pytest.raises(InvalidArgument, match="stride of 1 to 8"):
        task.heavy_strings(1, stride=9)
    with pytest.raises(InvalidArgument, match="max_kept"):
        task.heavy_strings(1, stride=8, max_kept=257)
    with pytest.raises(InvalidArgument, match="epsilon must be a number"):
        task.heavy_strings("lots")
    with pytest.raises(BudgetExhausted, match="nothing spent"):
        task.heavy_strings(11)
    clear_leader.open = True
    with pytest.raises(FailedPrecondition, match="still collecting"):
        task.heavy_strings(1)
    clear_leader.open, clear_leader.validity = False, "range"
    with pytest.raises(InvalidArgument, match="not a crawl task"):
        task.heavy_strings(1)
    assert clear_leader.requests == [] and clear_leader.spent == 0


# ----------------------------------------------------------------- the command line


def crawl_args(certs: Path, *argv: str) -> list[str]:
    return [
        "analyst", "crawl", "--leader", "127.0.0.1:9", "--certs", str(certs), "--task", "words",
        *argv,
    ]  # fmt: skip


def test_analyst_crawl_prints_the_strings_and_the_levels(
    clear_leader: ClearLeader, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(crawl_args(certs, "--epsilon", "2", "--stride", "8", "--tau", "10")) == 0
    out, err = capsys.readouterr()
    assert sorted(out.split()) == ["ab", "ac", "b"]
    assert "level 1/2: 8 prefix bits, 256 candidates, 2 kept" in err
    assert "level 2/2: 16 prefix bits, 512 candidates, 3 kept" in err
    assert "ε 2 spent of the walk's 2 over 2 of 2 levels" in err
    assert main(crawl_args(certs, "--epsilon", "1", "--tau", "25", "--json")) == 0
    out, err = capsys.readouterr()
    import json

    data = json.loads(out)
    assert data["found"] == ["ab"] and data["values"] == ["6162"] and data["stopped"] is None
    assert data["exact"]["epsilon_spent"] == "1" and data["exact"]["task_epsilon_left"] == "7"
    assert [lv["kept"] for lv in data["levels"]] == [1, 1] and data["levels"][0]["refused"] == 0


def test_analyst_crawl_says_why_a_walk_stopped_early(
    clear_leader: ClearLeader, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(crawl_args(certs, "--epsilon", "2", "--tau", "1000")) == 0
    out, err = capsys.readouterr()
    assert out == "" and "stopped early: no candidate of level 1" in err
    assert "ε 1 spent of the walk's 2 over 1 of 2 levels" in err


@pytest.mark.parametrize(
    ("argv", "validity", "message"),
    [
        (["--epsilon", "1", "--stride", "9"], "", "stride of 1 to 8"),
        (["--epsilon", "1", "--max-kept", "1000"], "", "max_kept"),
        (["--epsilon", "1"], "range", "not a crawl task"),
        (["--epsilon", "0"], "", "ε must be positive"),
        (["--stride", "4"], "", "give --epsilon for a new walk"),
        (["--epsilon", "1", "--tau", "0"], "", "must be >= 1"),
    ],
)
def test_analyst_crawl_refuses_a_bad_invocation(
    clear_leader: ClearLeader,
    certs: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    validity: str,
    message: str,
) -> None:
    clear_leader.validity = validity or clear_leader.validity
    try:
        rc = main(crawl_args(certs, *argv))
    except SystemExit as exc:  # argparse's own refusals
        rc = int(str(exc.code))
    assert rc == USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert clear_leader.requests == []


def test_create_task_gives_a_crawl_task_d_1(
    clear_leader: ClearLeader, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["analyst", "create-task", "--leader", "127.0.0.1:9", "--certs", str(certs)]
    assert main([*base, "--task", "words", "--validity", "crawl:64", "--embedding", "strings"]) == 0
    assert main([*base, "--task", "w2", "--embedding", "strings"]) == 0
    err = capsys.readouterr().err
    assert "--validity crawl:64" in err  # the default for strings, said on stderr
    assert [(s.d, s.validity, s.embedding) for s in clear_leader.created] == [
        (1, "crawl:64", "strings"), (1, "crawl:64", "strings"),
    ]  # fmt: skip
    assert main([*base, "--task", "w3", "--validity", "range"]) == USAGE
    assert "needs --d" in capsys.readouterr().err
    assert len(clear_leader.created) == 2


# ----------------------------------------------------------------- the docs


def test_the_documented_crawl_session_parses() -> None:
    text = (DOCS / "services.md").read_text()
    found = re.search(r"^### Strings: heavy hitters by the prefix crawl\n(.*?)(?=^##)", text,
                      re.M | re.DOTALL)  # fmt: skip
    assert found, "docs/services.md has no crawl section"
    blocks = re.findall(r"^```sh\n(.*?)^```", found.group(1), flags=re.M | re.DOTALL)
    commands = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("svtagg "):
                commands.append(shlex.split(line)[1:])
    names = [c[:2] for c in commands]
    for expected in (["analyst", "create-task"], ["client", "upload"], ["analyst", "close"],
                     ["analyst", "crawl"]):  # fmt: skip
        assert expected in names, names
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)
