"""Prio3 of svtagg.vdaf against every Prio3 test vector of draft-irtf-cfrg-vdaf-07
(tests/vectors/vdaf/07): sharding with the vector's nonce and randomness
reproduces the public share and input shares byte for byte, preparation the
prep shares and messages, then the output shares, aggregate shares and result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from svtagg.vdaf.prio3 import (
    Prio3,
    prio3_count,
    prio3_histogram,
    prio3_sum,
    prio3_sum_vec,
)

VECTORS = Path(__file__).parent / "vectors" / "vdaf" / "07"
FILES = sorted(p.name for p in VECTORS.glob("Prio3*.json"))


#: Every test here runs on the native field core and on the Python reference.
pytestmark = pytest.mark.usefixtures("vdaf_backend")


def instance(name: str, v: dict[str, Any]) -> Prio3:
    kind = name.split("_")[0]
    shares = v["shares"]
    if kind == "Prio3Count":
        return prio3_count(shares)
    if kind == "Prio3Sum":
        return prio3_sum(v["bits"], shares)
    if kind == "Prio3SumVec":
        return prio3_sum_vec(v["length"], v["bits"], v["chunk_length"], shares)
    if kind == "Prio3Histogram":
        return prio3_histogram(v["length"], v["chunk_length"], shares)
    raise AssertionError(f"no Prio3 instance for {name}")


def test_every_type_has_vectors() -> None:
    kinds = {name.split("_")[0] for name in FILES}
    assert kinds == {"Prio3Count", "Prio3Sum", "Prio3SumVec", "Prio3Histogram"}
    assert len(FILES) == 8


@pytest.mark.parametrize("name", FILES)
def test_vector(name: str) -> None:
    v = json.loads((VECTORS / name).read_text())
    vdaf = instance(name, v)
    verify_key = bytes.fromhex(v["verify_key"])
    out_shares: list[list[Any]] = [[] for _ in range(vdaf.shares)]
    for prep in v["prep"]:
        nonce, rand = bytes.fromhex(prep["nonce"]), bytes.fromhex(prep["rand"])
        public, inputs = vdaf.shard(prep["measurement"], nonce, rand)
        assert vdaf.encode_public_share(public).hex() == prep["public_share"]
        assert [vdaf.encode_input_share(s).hex() for s in inputs] == prep["input_shares"]

        # The aggregators start from the bytes they would receive.
        public = vdaf.decode_public_share(bytes.fromhex(prep["public_share"]))
        states, prep_shares = [], []
        for j, encoded in enumerate(prep["input_shares"]):
            share = vdaf.decode_input_share(j, bytes.fromhex(encoded))
            st, ps = vdaf.prep_init(verify_key, j, nonce, public, share)
            states.append(st)
            prep_shares.append(ps)
        assert [vdaf.encode_prep_share(ps).hex() for ps in prep_shares] == prep["prep_shares"][0]
        msg = vdaf.prep_shares_to_prep(prep_shares)
        assert [vdaf.encode_prep_msg(msg).hex()] == prep["prep_messages"]
        for j in range(vdaf.shares):
            out = vdaf.prep_next(states[j], msg)
            size = vdaf.field.encoded_size
            out_ints = vdaf.field.to_ints(out)
            assert [x.to_bytes(size, "little").hex() for x in out_ints] == prep["out_shares"][j]
            out_shares[j].append(out)
    agg_shares = [vdaf.aggregate(o) for o in out_shares]
    assert [vdaf.encode_agg_share(a).hex() for a in agg_shares] == v["agg_shares"]
    assert vdaf.unshard(agg_shares, len(v["prep"])) == v["agg_result"]
