"""The store contract for joint noise, on both backends (the fixtures of
tests/test_store_contract.py): a task keeps its noise option, and a stream's
jointly drawn γ share is stored in its first chunk only."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from test_store_contract import backend, params, store  # noqa: F401 - fixtures

from svtagg.dp.errors import FailedPrecondition
from svtagg.dp.kinds import StreamKind
from svtagg.servers.store import IN_CHUNK, Store


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
