"""The store contract for joint noise, on both backends (the fixtures of
tests/test_store_contract.py): a task keeps its noise option, and a stream's
jointly drawn γ share is stored in its first chunk only; and a stream's pool of
ahead-of-time shares hands out each sample once, across reopens."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from test_store_contract import Opener, backend, params, store  # noqa: F401 - fixtures

from svtagg.dp.errors import FailedPrecondition, InvalidArgument
from svtagg.dp.kinds import StreamKind
from svtagg.servers.store.jointpool import JointPool
from svtagg.servers.store.rules import FAILED, IN_CHUNK, Store


def test_a_task_keeps_its_noise_option(store: Store) -> None:  # noqa: F811
    joint = replace(params("j"), noise="joint")
    assert store.create_task(joint).params.noise == "joint"
    assert store.task("j").params == joint
    store.create_task(params("i"))
    assert store.task("i").params.noise == "independent"


def test_the_joint_gamma_is_stored_in_the_first_chunk_only(store: Store) -> None:  # noqa: F811
    store.create_task(replace(params(), noise="joint"))
    store.close_collection("t")
    store.mark_agreed("t", None)
    store.open_stream("s", "t", StreamKind.LAP24, Fraction(1), Fraction(0), Fraction(1, 2**80))
    assert store.task("t").budget.delta_spent == Fraction(1, 2**80)
    with pytest.raises(FailedPrecondition, match="first chunk"):
        store.set_joint_threshold_noise("s", 5)  # still opening
    store.set_threshold_noise("s", 0)
    with pytest.raises(FailedPrecondition, match="first chunk"):
        store.set_joint_threshold_noise("s", 5)  # open, not in a chunk
    assert store.begin_chunk("s") == 1
    store.set_joint_threshold_noise("s", 2**64 - 3)  # a ring share, any 64-bit word
    s = store.stream("s")
    assert (s.state, s.gamma) == (IN_CHUNK, 2**64 - 3)
    store.end_chunk("s", 1, close=False)
    store.begin_chunk("s")
    with pytest.raises(FailedPrecondition, match="first chunk"):
        store.set_joint_threshold_noise("s", 7)  # γ is kept for the stream's life
    assert store.stream("s").gamma == 2**64 - 3


# ---------------------------------------------------------------- ahead-of-time pools
def _u64(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.uint64)


def _open_joint(st: Store, sid: str = "s") -> None:
    if "t" not in st.task_ids():
        st.create_task(replace(params(), noise="joint"))
        st.close_collection("t")
        st.mark_agreed("t", None)
    st.open_stream(sid, "t", StreamKind.LAP24, Fraction(1, 4), Fraction(0), Fraction(0))
    st.set_threshold_noise(sid, 0)


def test_a_pool_hands_out_each_sample_once(backend: tuple[str, Opener]) -> None:  # noqa: F811
    """Reserved numbers are never reserved again (the helper refuses the leader's
    replay), a chunk takes a range once (nothing below `used` again, even the
    samples it skipped), and all of it survives a reopen."""
    opener = backend[1]
    st = opener()
    _open_joint(st)
    assert st.joint_pool("s") == JointPool()
    assert st.reserve_joint_batch("s", 3) == 0  # the leader's next
    assert st.reserve_joint_batch("s", 2, lo=3) == 3  # the helper, at the leader's lo
    with pytest.raises(FailedPrecondition, match="reserved before"):
        st.reserve_joint_batch("s", 2, lo=4)
    with pytest.raises(InvalidArgument, match="1 to"):
        st.reserve_joint_batch("s", 0)
    assert st.add_joint_batch("s", 0, _u64(10, 11, 12), gamma=99)
    assert st.add_joint_batch("s", 3, _u64(13, 14), gamma=None)
    assert not st.add_joint_batch("s", 5, _u64(15), gamma=None)  # never reserved
    pool = st.joint_pool("s")
    assert (pool.next, pool.used, pool.gamma_ready, pool.runs) == (5, 0, True, ((0, 5),))
    assert st.stream("s").gamma == 99
    with pytest.raises(FailedPrecondition, match="not in a chunk"):
        st.take_joint_noise("s", 0, 2)
    st.begin_chunk("s")
    assert st.take_joint_noise("s", 1, 2).tolist() == [11, 12]  # sample 0 is discarded
    for lo in (0, 2):
        with pytest.raises(FailedPrecondition, match="already consumed"):
            st.take_joint_noise("s", lo, 1)
    with pytest.raises(FailedPrecondition, match="not all held"):
        st.take_joint_noise("s", 4, 2)
    st.end_chunk("s", 2, close=False)
    st.close()

    again = opener()
    pool = again.joint_pool("s")
    assert (pool.next, pool.used, pool.gamma_ready, pool.runs) == (5, 3, True, ((3, 2),))
    with pytest.raises(FailedPrecondition, match="reserved before"):
        again.reserve_joint_batch("s", 1, lo=0)
    with pytest.raises(FailedPrecondition, match="already consumed"):
        again.begin_pooled_chunk("s", 2, 2, 1)  # refused whole: no chunk begun
    assert again.stream("s").chunks == 1
    number, nu = again.begin_pooled_chunk("s", 2, 3, 2)
    assert (number, nu.tolist()) == (2, [13, 14])
    assert again.joint_pool("s").runs == ()


def test_gamma_joins_the_pool_only_before_the_first_chunk(store: Store) -> None:  # noqa: F811
    _open_joint(store)
    store.reserve_joint_batch("s", 2)
    store.begin_chunk("s")
    assert store.add_joint_batch("s", 0, _u64(1), gamma=7)  # ν kept, γ discarded
    assert store.stream("s").gamma == 0 and not store.joint_pool("s").gamma_ready


def test_a_stream_that_answers_no_more_keeps_no_shares(
    backend: tuple[str, Opener],  # noqa: F811
) -> None:
    """Failed or interrupted by a stop: its held shares are deleted (counters
    kept), and a batch that arrives afterwards is not kept."""
    opener = backend[1]
    st = opener()
    _open_joint(st, "a")
    _open_joint(st, "b")
    for sid in ("a", "b"):
        st.reserve_joint_batch(sid, 2)
        st.add_joint_batch(sid, 0, _u64(1, 2), None)
    st.begin_chunk("a")
    st.take_joint_noise("a", 0, 1)
    st.close()  # "a" was mid-chunk
    again = opener()
    assert again.stream("a").state == FAILED
    assert again.joint_pool("a").runs == () and again.joint_pool("a").used == 1
    assert again.joint_pool("b").runs == ((0, 2),)
    again.fail_stream("b")
    again.discard_joint_pool("b")
    assert again.joint_pool("b").runs == ()
    with pytest.raises(FailedPrecondition, match="answers no more"):
        again.reserve_joint_batch("b", 1)
    assert not again.add_joint_batch("b", 0, _u64(5), None)
