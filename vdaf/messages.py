"""Prio3's vocabulary (draft-irtf-cfrg-vdaf-07 §7.2): sizes, the XOF usages, the
per-report messages and the verification error, shared by the per-report
algorithms (vdaf/prio3.py) and the batched ones (vdaf/rows.py)."""

from __future__ import annotations

from dataclasses import dataclass

from svtagg.vdaf.field import Vec
from svtagg.vdaf.xof import SEED_SIZE

NONCE_SIZE = 16
VERIFY_KEY_SIZE = SEED_SIZE

# XOF usages (draft §7.2.5)
USAGE_MEAS_SHARE = 1
USAGE_PROOF_SHARE = 2
USAGE_JOINT_RANDOMNESS = 3
USAGE_PROVE_RANDOMNESS = 4
USAGE_QUERY_RANDOMNESS = 5
USAGE_JOINT_RAND_SEED = 6
USAGE_JOINT_RAND_PART = 7


class VerifyError(ValueError):
    """A report that fails preparation: the proof is rejected or the joint randomness
    the Client used is not the one its shares commit to (draft: ERR_VERIFY)."""


@dataclass(frozen=True)
class InputShare:
    """One aggregator's input share.  The Leader's carries vectors (`meas`, `proof`);
    a Helper's carries the seeds they expand from (`meas_seed`, `proof_seed`)."""

    meas: Vec | None = None
    proof: Vec | None = None
    meas_seed: bytes | None = None
    proof_seed: bytes | None = None
    blind: bytes | None = None


@dataclass(frozen=True)
class PrepShare:
    verifier: Vec
    joint_rand_part: bytes | None


@dataclass(frozen=True)
class PrepState:
    out_share: Vec
    corrected_joint_rand_seed: bytes | None
