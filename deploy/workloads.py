"""Synthetic per-user data for the demo and the simulation (simulated users, not
shares or noise: numpy's seeded generator is the right tool here), and the
forged reports of the demo's malicious clients (their randomness from the
CSPRNG, as a client's)."""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

from svtagg.client.embeddings import heavy_hitters_embedding
from svtagg.client.upload import Batch
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import REPORT_ID_BYTES
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import SparseMultihot, SparseRange
from svtagg.vdaf.validity import Validity


def zipf_categories(
    users: int, d: int, exponent: float, per_user: int, seed: int
) -> list[list[int]]:
    """Each user holds up to `per_user` distinct categories drawn from Zipf(exponent) on d."""
    gen = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1) ** exponent
    label = gen.permutation(d)  # the popular categories are not simply 0, 1, 2, ...
    draws = label[gen.choice(d, size=(users, per_user), p=p / p.sum())]
    return [sorted(set(row)) for row in draws.tolist()]


_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "sh", "st", "th", "tr")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oa")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck")


def word_corpus(users: int, vocabulary: int, exponent: float, seed: int) -> list[str]:
    """Each user's word: a vocabulary of `vocabulary` distinct made-up words of
    one to three syllables (at most 8 bytes), drawn with Zipf(exponent)
    popularity over a random ranking — the strings demo's text."""
    gen = np.random.default_rng(seed)
    words: dict[str, None] = {}
    while len(words) < vocabulary:
        w = "".join(
            str(gen.choice(_ONSETS)) + str(gen.choice(_VOWELS)) + str(gen.choice(_CODAS))
            for _ in range(int(gen.choice([1, 2, 2, 3])))
        )
        if len(w) <= 8:
            words[w] = None
    vocab = list(words)
    p = 1.0 / np.arange(1, vocabulary + 1) ** exponent
    return [vocab[i] for i in gen.choice(vocabulary, size=users, p=p / p.sum())]


def workload(name: str, n: int, d: int, seed: int) -> npt.NDArray[np.float64]:
    if name == "heavy_hitters":
        return heavy_hitters_embedding(zipf_categories(n, d, 1.1, 3, seed), d)
    return np.random.default_rng(seed).random((n, d))


def model_selection(users: int, d: int, seed: int) -> npt.NDArray[np.float64]:
    """Private model (or hyperparameter) selection: user i's value for candidate j is
    1 − clipped loss of candidate j on user i, so every record touches all d
    candidates (r = d).  Candidate j's mean loss is 0.5 + 0.3·u_j (u_j uniform), a
    user's loss that plus N(0, 0.2²) clipped to [0, 1]: the best candidates are a
    few score units apart at n = 10⁴, d = 10³."""
    gen = np.random.default_rng(seed)
    base = 0.5 + 0.3 * gen.random(d)
    out = np.empty((users, d))
    for start in range(0, users, 2000):  # bounded temporaries
        m = min(2000, users - start)
        out[start : start + m] = 1.0 - np.clip(base + 0.2 * gen.standard_normal((m, d)), 0, 1)
    return out


def laplace_argmax(
    sums: npt.NDArray[np.float64], epsilon: float, l1_sensitivity: float, seed: int
) -> int:
    """Laplace on all d sums (scale Δ₁/ε; a replaced record in [0,1]^d moves the sums
    by ≤ d in ℓ1), then the argmax: the naive central baseline."""
    gen = np.random.default_rng(seed)
    return int(np.argmax(sums + gen.laplace(0.0, l1_sensitivity / epsilon, sums.shape)))


def forged_batch(task_id: str, circuit: Validity, item: int, count: int, clients: int) -> Batch:
    """What `clients` malicious clients forge: a report claiming `count` on
    coordinate `item` (a digit `count` where a valid report has a 0 or a 1),
    proved honestly for that encoding — the proof is well made, the
    measurement is not valid, and the servers refuse it at ingest.  On a
    sparse task: DPF keys made honestly for the weight `count` (on a
    sparse-multihot task, the first item's key)."""
    if circuit.sparse:
        return _forged_sparse(task_id, circuit, item, count, clients)
    prio = circuit.prio3
    width = circuit.frac_bits + 1 if circuit.name == "range" else 1
    ids = [os.urandom(REPORT_ID_BYTES) for _ in range(clients)]
    lead, help_ = pb.UploadBatch(task_id=task_id), pb.UploadBatch(task_id=task_id)
    for rid in ids:
        meas = [0] * prio.flp.meas_len
        meas[item * width] = count
        seeds = [os.urandom(16) for _ in range(prio.rand_size // 16)]
        public, shares = prio.shard_encoded(FIELD128.vec(meas), rid, seeds)
        encoded = prio.encode_public_share(public)
        lead.reports.add(
            report_id=rid, input_share=prio.encode_input_share(shares[0]), public_share=encoded
        )
        help_.reports.add(
            report_id=rid, input_share=prio.encode_input_share(shares[1]), public_share=encoded
        )
    return Batch(lead, help_, proofs=True)


def _forged_sparse(task_id: str, circuit: Validity, item: int, count: int, clients: int) -> Batch:
    lead, help_ = pb.UploadBatch(task_id=task_id), pb.UploadBatch(task_id=task_id)
    for _ in range(clients):
        rid = os.urandom(REPORT_ID_BYTES)
        scheme = circuit.scheme
        if isinstance(scheme, SparseRange):  # a value of `count` units on the item
            points, ws = scheme.entries([item], [scheme.top])
            public, keys = scheme.gen_payloads(points, [count] + ws[1:], rid, os.urandom(32))
        elif isinstance(scheme, SparseMultihot):
            points = scheme.points([item])
            weights = [count] + [1] * (len(points) - 1)
            public, keys = scheme.gen_points(points, rid, os.urandom(32), weights)
        else:
            public, keys = scheme.gen(item, rid, os.urandom(32), weight=count)
        lead.reports.add(report_id=rid, input_share=keys[0], public_share=public)
        help_.reports.add(report_id=rid, input_share=keys[1], public_share=public)
    return Batch(lead, help_, proofs=True)
