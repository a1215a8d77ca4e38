"""A new task's spec: the one builder that `svtagg analyst create-task`, the demo,
the simulation and the Python front door (`Deployment.create_task`) share."""

from __future__ import annotations

from typing import TypedDict, Unpack

from svtagg.proto import svtagg_pb2 as pb


class TaskOptions(TypedDict, total=False):
    """A task's optional settings; each one left out takes `task_spec`'s default.

    frac_bits: F, the fraction bits of an encoded value (16).  min_batch: the
    smallest upload batch (1).  delta: the total δ, exact text or a number (0).
    epsilon_min: the smallest ε one stream may use, or "auto" (the default) for
    the smallest the overflow bound allows.  validity: the circuit every report
    proves at ingest (range, onehot, sparse-onehot, multihot, multihot:r,
    sparse-multihot:r, sparse-range:r, or crawl:B for strings of B bits with
    d = 1; "" for none).
    embedding: what the clients upload (heavy_hitters, sparse_mean, marginals,
    fp_loss, vectors or strings; "" records none).  noise: "independent" (the default:
    each server draws its own noise) or "joint" (the noise of each lap24 / lap3
    stream drawn once inside the garbled circuit; needs delta > 0).
    """

    frac_bits: int
    min_batch: int
    delta: str | float
    epsilon_min: str
    validity: str
    embedding: str
    noise: str


def default_validity(embedding: str) -> tuple[str, str]:
    """The validity circuit a task takes when its creator names none, and why:
    what a default server (which requires one) accepts, and the cheapest that
    holds every report of that embedding.  heavy_hitters rows are 0/1 per
    category (a user may hold several): multihot; strings are walked by the
    prefix crawl: crawl:64 (strings of up to 8 bytes); every other
    embedding's values lie in [0, 1]: range."""
    if embedding == "heavy_hitters":
        return "multihot", "each category is 0 or 1 (heavy_hitters rows)"
    if embedding == "strings":
        return "crawl:64", "one string of up to 8 bytes per user; crawl:B takes B/8 bytes"
    return "range", "each value is in [0, 1]"


def task_spec(
    task_id: str, d: int, n_max: int, epsilon: str | float, **options: Unpack[TaskOptions]
) -> pb.TaskSpec:
    """A task spec with total budget `epsilon` (exact text such as "1/2", or a
    number) and `options`; epsilon_min "auto" is the smallest ε the overflow bound
    allows."""
    from svtagg.dp.task import safe_epsilon_min

    frac_bits = options.get("frac_bits", 16)
    epsilon_min = options.get("epsilon_min", "auto")
    if epsilon_min == "auto":
        epsilon_min = str(safe_epsilon_min(n_max, frac_bits))
    return pb.TaskSpec(
        task_id=task_id,
        d=d,
        frac_bits=frac_bits,
        n_max=n_max,
        min_batch=options.get("min_batch", 1),
        epsilon_total=str(epsilon),
        delta_total=str(options.get("delta", "0")),
        epsilon_min=epsilon_min,
        embedding=options.get("embedding", ""),
        validity=options.get("validity", ""),
        noise="" if options.get("noise", "independent") == "independent" else options["noise"],
    )
