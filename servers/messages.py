"""Server state as protobuf messages and back (the conversions the drivers and the
gRPC services share)."""

from __future__ import annotations

from svtagg.dp.task import TaskParams, TaskSpec, parse_task_params
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import KIND_TO_PB
from svtagg.servers.store import OPEN, StreamState, TaskState


def task_info(t: TaskState) -> pb.TaskInfo:
    p = t.params
    return pb.TaskInfo(
        spec=pb.TaskSpec(
            task_id=p.task_id,
            d=p.d,
            frac_bits=p.frac_bits,
            n_max=p.n_max,
            min_batch=p.min_batch,
            epsilon_total=str(p.epsilon_total),
            delta_total=str(p.delta_total),
            epsilon_min=str(p.epsilon_min),
            validate_reports=p.validate_reports,
            embedding=p.embedding,
        ),
        n=t.n,
        collection_open=t.collection_open,
        budget=pb.BudgetStatus(
            epsilon_total=str(t.budget.epsilon_total),
            delta_total=str(t.budget.delta_total),
            epsilon_spent=str(t.budget.epsilon_spent),
            delta_spent=str(t.budget.delta_spent),
        ),
        streams=t.streams,
        agreed=t.agreed,
    )


def stream_info(s: StreamState) -> pb.StreamInfo:
    return pb.StreamInfo(
        stream_id=s.stream_id,
        task_id=s.task_id,
        kind=KIND_TO_PB[s.kind],
        epsilon=str(s.epsilon),
        delta=str(s.delta),
        closed=s.state != OPEN,
        queries_answered=s.queries,
    )


def spec_params(spec: pb.TaskSpec) -> TaskParams:
    return parse_task_params(
        TaskSpec(
            spec.task_id,
            spec.d,
            spec.frac_bits,
            spec.n_max,
            spec.min_batch,
            spec.epsilon_total,
            spec.delta_total,
            spec.epsilon_min,
            spec.validate_reports,
            spec.embedding,
        )
    )


def collection_digest(t: TaskState) -> pb.CollectionDigest:
    return pb.CollectionDigest(n=t.n, report_digest=t.digest)
