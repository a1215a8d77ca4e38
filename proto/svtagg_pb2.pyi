from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_KIND_UNSPECIFIED: _ClassVar[StreamKind]
    LAP24: _ClassVar[StreamKind]
    LAP3: _ClassVar[StreamKind]
    EXP3: _ClassVar[StreamKind]
    CTT: _ClassVar[StreamKind]
    NMAX: _ClassVar[StreamKind]
    CRAWL: _ClassVar[StreamKind]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    HIGH: _ClassVar[Outcome]
    LOW: _ClassVar[Outcome]
    CLOSE: _ClassVar[Outcome]
STREAM_KIND_UNSPECIFIED: StreamKind
LAP24: StreamKind
LAP3: StreamKind
EXP3: StreamKind
CTT: StreamKind
NMAX: StreamKind
CRAWL: StreamKind
OUTCOME_UNSPECIFIED: Outcome
HIGH: Outcome
LOW: Outcome
CLOSE: Outcome

class TaskSpec(_message.Message):
    __slots__ = ("task_id", "d", "frac_bits", "n_max", "min_batch", "epsilon_total", "delta_total", "epsilon_min", "validate_reports", "embedding", "validity", "noise")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    D_FIELD_NUMBER: _ClassVar[int]
    FRAC_BITS_FIELD_NUMBER: _ClassVar[int]
    N_MAX_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    EPSILON_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DELTA_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_MIN_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    d: int
    frac_bits: int
    n_max: int
    min_batch: int
    epsilon_total: str
    delta_total: str
    epsilon_min: str
    validate_reports: bool
    embedding: str
    validity: str
    noise: str
    def __init__(self, task_id: _Optional[str] = ..., d: _Optional[int] = ..., frac_bits: _Optional[int] = ..., n_max: _Optional[int] = ..., min_batch: _Optional[int] = ..., epsilon_total: _Optional[str] = ..., delta_total: _Optional[str] = ..., epsilon_min: _Optional[str] = ..., validate_reports: _Optional[bool] = ..., embedding: _Optional[str] = ..., validity: _Optional[str] = ..., noise: _Optional[str] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class BudgetStatus(_message.Message):
    __slots__ = ("epsilon_total", "delta_total", "epsilon_spent", "delta_spent")
    EPSILON_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DELTA_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    DELTA_SPENT_FIELD_NUMBER: _ClassVar[int]
    epsilon_total: str
    delta_total: str
    epsilon_spent: str
    delta_spent: str
    def __init__(self, epsilon_total: _Optional[str] = ..., delta_total: _Optional[str] = ..., epsilon_spent: _Optional[str] = ..., delta_spent: _Optional[str] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("spec", "n", "collection_open", "budget", "helper_budget", "streams", "agreed", "dropped_reports", "verify_key", "rejected")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_OPEN_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    HELPER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_KEY_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    n: int
    collection_open: bool
    budget: BudgetStatus
    helper_budget: BudgetStatus
    streams: int
    agreed: bool
    dropped_reports: int
    verify_key: bytes
    rejected: _containers.ScalarMap[str, int]
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., n: _Optional[int] = ..., collection_open: _Optional[bool] = ..., budget: _Optional[_Union[BudgetStatus, _Mapping]] = ..., helper_budget: _Optional[_Union[BudgetStatus, _Mapping]] = ..., streams: _Optional[int] = ..., agreed: _Optional[bool] = ..., dropped_reports: _Optional[int] = ..., verify_key: _Optional[bytes] = ..., rejected: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TaskList(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Report(_message.Message):
    __slots__ = ("report_id", "explicit_share", "seed", "input_share", "public_share")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_SHARE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHARE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    explicit_share: bytes
    seed: bytes
    input_share: bytes
    public_share: bytes
    def __init__(self, report_id: _Optional[bytes] = ..., explicit_share: _Optional[bytes] = ..., seed: _Optional[bytes] = ..., input_share: _Optional[bytes] = ..., public_share: _Optional[bytes] = ...) -> None: ...

class UploadBatch(_message.Message):
    __slots__ = ("task_id", "reports")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    def __init__(self, task_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ...) -> None: ...

class UploadResult(_message.Message):
    __slots__ = ("accepted", "n", "rejected")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    n: int
    rejected: _containers.ScalarMap[str, int]
    def __init__(self, accepted: _Optional[int] = ..., n: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ...) -> None: ...

class OpenStreamRequest(_message.Message):
    __slots__ = ("task_id", "kind", "epsilon", "delta", "plan_id", "plan_group")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_GROUP_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    kind: StreamKind
    epsilon: str
    delta: str
    plan_id: str
    plan_group: int
    def __init__(self, task_id: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., epsilon: _Optional[str] = ..., delta: _Optional[str] = ..., plan_id: _Optional[str] = ..., plan_group: _Optional[int] = ...) -> None: ...

class PlanGroup(_message.Message):
    __slots__ = ("epsilon", "delta")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    epsilon: str
    delta: str
    def __init__(self, epsilon: _Optional[str] = ..., delta: _Optional[str] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("task_id", "groups", "delta_slack", "plan_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DELTA_SLACK_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    groups: _containers.RepeatedCompositeFieldContainer[PlanGroup]
    delta_slack: str
    plan_id: str
    def __init__(self, task_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[PlanGroup, _Mapping]]] = ..., delta_slack: _Optional[str] = ..., plan_id: _Optional[str] = ...) -> None: ...

class PlanRef(_message.Message):
    __slots__ = ("plan_id",)
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    def __init__(self, plan_id: _Optional[str] = ...) -> None: ...

class PlanInfo(_message.Message):
    __slots__ = ("plan_id", "task_id", "epsilon", "delta", "rule", "state", "refunded_epsilon", "refunded_delta")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_EPSILON_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_DELTA_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    task_id: str
    epsilon: str
    delta: str
    rule: str
    state: str
    refunded_epsilon: str
    refunded_delta: str
    def __init__(self, plan_id: _Optional[str] = ..., task_id: _Optional[str] = ..., epsilon: _Optional[str] = ..., delta: _Optional[str] = ..., rule: _Optional[str] = ..., state: _Optional[str] = ..., refunded_epsilon: _Optional[str] = ..., refunded_delta: _Optional[str] = ...) -> None: ...

class PlanList(_message.Message):
    __slots__ = ("plans",)
    PLANS_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[PlanInfo]
    def __init__(self, plans: _Optional[_Iterable[_Union[PlanInfo, _Mapping]]] = ...) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("stream_id", "task_id", "kind", "epsilon", "delta", "closed", "queries_answered")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: str
    delta: str
    closed: bool
    queries_answered: int
    def __init__(self, stream_id: _Optional[str] = ..., task_id: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., epsilon: _Optional[str] = ..., delta: _Optional[str] = ..., closed: _Optional[bool] = ..., queries_answered: _Optional[int] = ...) -> None: ...

class Queries(_message.Message):
    __slots__ = ("index", "complement")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COMPLEMENT_FIELD_NUMBER: _ClassVar[int]
    index: _containers.RepeatedScalarFieldContainer[int]
    complement: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, index: _Optional[_Iterable[int]] = ..., complement: _Optional[_Iterable[bool]] = ...) -> None: ...

class AskRequest(_message.Message):
    __slots__ = ("stream_id", "queries", "tau")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    queries: Queries
    tau: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stream_id: _Optional[str] = ..., queries: _Optional[_Union[Queries, _Mapping]] = ..., tau: _Optional[_Iterable[int]] = ...) -> None: ...

class AskResponse(_message.Message):
    __slots__ = ("yes", "index", "closed", "peer_bytes", "noise_drawn")
    YES_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    PEER_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOISE_DRAWN_FIELD_NUMBER: _ClassVar[int]
    yes: bool
    index: int
    closed: bool
    peer_bytes: int
    noise_drawn: int
    def __init__(self, yes: _Optional[bool] = ..., index: _Optional[int] = ..., closed: _Optional[bool] = ..., peer_bytes: _Optional[int] = ..., noise_drawn: _Optional[int] = ...) -> None: ...

class CompareRequest(_message.Message):
    __slots__ = ("stream_id", "queries", "tau_low", "tau_high")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    TAU_LOW_FIELD_NUMBER: _ClassVar[int]
    TAU_HIGH_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    queries: Queries
    tau_low: _containers.RepeatedScalarFieldContainer[int]
    tau_high: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stream_id: _Optional[str] = ..., queries: _Optional[_Union[Queries, _Mapping]] = ..., tau_low: _Optional[_Iterable[int]] = ..., tau_high: _Optional[_Iterable[int]] = ...) -> None: ...

class CompareResponse(_message.Message):
    __slots__ = ("outcomes", "closed", "peer_bytes")
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    PEER_BYTES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedScalarFieldContainer[Outcome]
    closed: bool
    peer_bytes: int
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, str]]] = ..., closed: _Optional[bool] = ..., peer_bytes: _Optional[int] = ...) -> None: ...

class NoisyMaxRequest(_message.Message):
    __slots__ = ("stream_id", "queries", "more")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    queries: Queries
    more: bool
    def __init__(self, stream_id: _Optional[str] = ..., queries: _Optional[_Union[Queries, _Mapping]] = ..., more: _Optional[bool] = ...) -> None: ...

class NoisyMaxResponse(_message.Message):
    __slots__ = ("index", "closed", "peer_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    PEER_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    closed: bool
    peer_bytes: int
    def __init__(self, index: _Optional[int] = ..., closed: _Optional[bool] = ..., peer_bytes: _Optional[int] = ...) -> None: ...

class CrawlLevelRequest(_message.Message):
    __slots__ = ("task_id", "walk_id", "parents", "depth", "steps", "epsilon", "tau")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WALK_ID_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    walk_id: str
    parents: bytes
    depth: int
    steps: int
    epsilon: str
    tau: int
    def __init__(self, task_id: _Optional[str] = ..., walk_id: _Optional[str] = ..., parents: _Optional[bytes] = ..., depth: _Optional[int] = ..., steps: _Optional[int] = ..., epsilon: _Optional[str] = ..., tau: _Optional[int] = ...) -> None: ...

class CrawlLevelResponse(_message.Message):
    __slots__ = ("walk_id", "stream_id", "candidates", "above", "refused", "peer_bytes")
    WALK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    ABOVE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PEER_BYTES_FIELD_NUMBER: _ClassVar[int]
    walk_id: str
    stream_id: str
    candidates: int
    above: bytes
    refused: int
    peer_bytes: int
    def __init__(self, walk_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., candidates: _Optional[int] = ..., above: _Optional[bytes] = ..., refused: _Optional[int] = ..., peer_bytes: _Optional[int] = ...) -> None: ...

class PrepareNoiseRequest(_message.Message):
    __slots__ = ("task_id", "kind", "epsilon", "count")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    kind: StreamKind
    epsilon: str
    count: int
    def __init__(self, task_id: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., epsilon: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class PrepareNoiseResponse(_message.Message):
    __slots__ = ("held", "pending", "cap", "task_held")
    HELD_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    TASK_HELD_FIELD_NUMBER: _ClassVar[int]
    held: int
    pending: int
    cap: int
    task_held: int
    def __init__(self, held: _Optional[int] = ..., pending: _Optional[int] = ..., cap: _Optional[int] = ..., task_held: _Optional[int] = ...) -> None: ...

class CollectionDigest(_message.Message):
    __slots__ = ("n", "report_digest", "task_id", "agreed", "pass_id")
    N_FIELD_NUMBER: _ClassVar[int]
    REPORT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    n: int
    report_digest: bytes
    task_id: str
    agreed: bool
    pass_id: bytes
    def __init__(self, n: _Optional[int] = ..., report_digest: _Optional[bytes] = ..., task_id: _Optional[str] = ..., agreed: _Optional[bool] = ..., pass_id: _Optional[bytes] = ...) -> None: ...

class ReportIds(_message.Message):
    __slots__ = ("task_id", "report_ids", "more")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    report_ids: bytes
    more: bool
    def __init__(self, task_id: _Optional[str] = ..., report_ids: _Optional[bytes] = ..., more: _Optional[bool] = ...) -> None: ...

class ReportPage(_message.Message):
    __slots__ = ("task_id", "after", "limit")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    after: bytes
    limit: int
    def __init__(self, task_id: _Optional[str] = ..., after: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class PrepareStreamRequest(_message.Message):
    __slots__ = ("stream_id", "task_id", "kind", "epsilon", "delta", "plan_id", "plan_group", "replay")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_GROUP_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    task_id: str
    kind: StreamKind
    epsilon: str
    delta: str
    plan_id: str
    plan_group: int
    replay: bool
    def __init__(self, stream_id: _Optional[str] = ..., task_id: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., epsilon: _Optional[str] = ..., delta: _Optional[str] = ..., plan_id: _Optional[str] = ..., plan_group: _Optional[int] = ..., replay: _Optional[bool] = ...) -> None: ...

class ChunkHeader(_message.Message):
    __slots__ = ("stream_id", "chunk_no", "queries", "compare", "validate_task_id", "report_ids", "robust_task_id", "coord_lo", "coord_hi", "pass_id", "noisy_max", "noisy_max_more", "joint_lo", "joint_count", "joint_gamma", "joint_batch", "crawl", "prepared_task_id", "prepared_shape", "prepared_epoch", "prepared_move", "prepared_lo")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_NO_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROBUST_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COORD_LO_FIELD_NUMBER: _ClassVar[int]
    COORD_HI_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    NOISY_MAX_FIELD_NUMBER: _ClassVar[int]
    NOISY_MAX_MORE_FIELD_NUMBER: _ClassVar[int]
    JOINT_LO_FIELD_NUMBER: _ClassVar[int]
    JOINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    JOINT_GAMMA_FIELD_NUMBER: _ClassVar[int]
    JOINT_BATCH_FIELD_NUMBER: _ClassVar[int]
    CRAWL_FIELD_NUMBER: _ClassVar[int]
    PREPARED_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PREPARED_SHAPE_FIELD_NUMBER: _ClassVar[int]
    PREPARED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREPARED_MOVE_FIELD_NUMBER: _ClassVar[int]
    PREPARED_LO_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    chunk_no: int
    queries: Queries
    compare: bool
    validate_task_id: str
    report_ids: bytes
    robust_task_id: str
    coord_lo: int
    coord_hi: int
    pass_id: bytes
    noisy_max: bool
    noisy_max_more: bool
    joint_lo: int
    joint_count: int
    joint_gamma: bool
    joint_batch: bool
    crawl: bool
    prepared_task_id: str
    prepared_shape: str
    prepared_epoch: bytes
    prepared_move: bool
    prepared_lo: int
    def __init__(self, stream_id: _Optional[str] = ..., chunk_no: _Optional[int] = ..., queries: _Optional[_Union[Queries, _Mapping]] = ..., compare: _Optional[bool] = ..., validate_task_id: _Optional[str] = ..., report_ids: _Optional[bytes] = ..., robust_task_id: _Optional[str] = ..., coord_lo: _Optional[int] = ..., coord_hi: _Optional[int] = ..., pass_id: _Optional[bytes] = ..., noisy_max: _Optional[bool] = ..., noisy_max_more: _Optional[bool] = ..., joint_lo: _Optional[int] = ..., joint_count: _Optional[int] = ..., joint_gamma: _Optional[bool] = ..., joint_batch: _Optional[bool] = ..., crawl: _Optional[bool] = ..., prepared_task_id: _Optional[str] = ..., prepared_shape: _Optional[str] = ..., prepared_epoch: _Optional[bytes] = ..., prepared_move: _Optional[bool] = ..., prepared_lo: _Optional[int] = ...) -> None: ...

class SessionOpen(_message.Message):
    __slots__ = ("session_id", "data_channel", "ot_extension", "garbling", "comparison_path")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    OT_EXTENSION_FIELD_NUMBER: _ClassVar[int]
    GARBLING_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_PATH_FIELD_NUMBER: _ClassVar[int]
    session_id: bytes
    data_channel: bool
    ot_extension: str
    garbling: str
    comparison_path: str
    def __init__(self, session_id: _Optional[bytes] = ..., data_channel: _Optional[bool] = ..., ot_extension: _Optional[str] = ..., garbling: _Optional[str] = ..., comparison_path: _Optional[str] = ...) -> None: ...

class PeerStatus(_message.Message):
    __slots__ = ("ok", "code", "message", "refusal", "data_port")
    OK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    code: int
    message: str
    refusal: str
    data_port: int
    def __init__(self, ok: _Optional[bool] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., refusal: _Optional[str] = ..., data_port: _Optional[int] = ...) -> None: ...

class PeerFrame(_message.Message):
    __slots__ = ("header", "fragment", "open", "status", "more", "then_fragment")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    THEN_FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    header: ChunkHeader
    fragment: bytes
    open: SessionOpen
    status: PeerStatus
    more: bool
    then_fragment: bytes
    def __init__(self, header: _Optional[_Union[ChunkHeader, _Mapping]] = ..., fragment: _Optional[bytes] = ..., open: _Optional[_Union[SessionOpen, _Mapping]] = ..., status: _Optional[_Union[PeerStatus, _Mapping]] = ..., more: _Optional[bool] = ..., then_fragment: _Optional[bytes] = ...) -> None: ...

class StreamRef(_message.Message):
    __slots__ = ("stream_id",)
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    def __init__(self, stream_id: _Optional[str] = ...) -> None: ...

class VerifyBatch(_message.Message):
    __slots__ = ("task_id", "report_ids", "prep_shares")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    PREP_SHARES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    report_ids: bytes
    prep_shares: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, task_id: _Optional[str] = ..., report_ids: _Optional[bytes] = ..., prep_shares: _Optional[_Iterable[bytes]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("prep_shares", "verdicts", "replayed", "n")
    PREP_SHARES_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    prep_shares: _containers.RepeatedScalarFieldContainer[bytes]
    verdicts: bytes
    replayed: bool
    n: int
    def __init__(self, prep_shares: _Optional[_Iterable[bytes]] = ..., verdicts: _Optional[bytes] = ..., replayed: _Optional[bool] = ..., n: _Optional[int] = ...) -> None: ...

class CrawlStepRequest(_message.Message):
    __slots__ = ("stream_id", "task_id", "walk_id", "parents", "depth", "steps", "prep_shares", "reports")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WALK_ID_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PREP_SHARES_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    task_id: str
    walk_id: str
    parents: bytes
    depth: int
    steps: int
    prep_shares: bytes
    reports: int
    def __init__(self, stream_id: _Optional[str] = ..., task_id: _Optional[str] = ..., walk_id: _Optional[str] = ..., parents: _Optional[bytes] = ..., depth: _Optional[int] = ..., steps: _Optional[int] = ..., prep_shares: _Optional[bytes] = ..., reports: _Optional[int] = ...) -> None: ...

class CrawlStepResult(_message.Message):
    __slots__ = ("prep_shares",)
    PREP_SHARES_FIELD_NUMBER: _ClassVar[int]
    prep_shares: bytes
    def __init__(self, prep_shares: _Optional[bytes] = ...) -> None: ...
