from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ON_DUPLICATE_KEEP: OnDuplicate
ON_DUPLICATE_REPLACE: OnDuplicate
SETTLE_OP_ACK: SettleOp
SETTLE_OP_EXTEND: SettleOp
SETTLE_OP_NACK: SettleOp
SETTLE_OP_PROGRESS: SettleOp
SETTLE_OP_UNSPECIFIED: SettleOp
WAIT_STATE_AVAILABLE: WaitState
WAIT_STATE_CANCELLED: WaitState
WAIT_STATE_COMPLETED: WaitState
WAIT_STATE_DEAD: WaitState
WAIT_STATE_LEASED: WaitState
WAIT_STATE_SCHEDULED: WaitState
WAIT_STATE_UNKNOWN: WaitState
WAIT_STATE_UNSPECIFIED: WaitState

class AckBatchRequest(_message.Message):
    __slots__ = ["acks"]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckRequest]
    def __init__(self, acks: _Optional[_Iterable[_Union[AckRequest, _Mapping]]] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ["enqueue", "job_id", "lease_token", "result"]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    enqueue: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    job_id: str
    lease_token: str
    result: bytes
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., enqueue: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., result: _Optional[bytes] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ["enqueued"]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    enqueued: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, enqueued: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ["code", "job_id", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    job_id: str
    message: str
    def __init__(self, job_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Cancelled(_message.Message):
    __slots__ = ["job_id", "lease_token"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ["acks", "confirm_settles", "extends", "max_in_flight", "nacks", "progress", "subscribe"]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_SETTLES_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckRequest]
    confirm_settles: bool
    extends: _containers.RepeatedCompositeFieldContainer[ExtendLeaseRequest]
    max_in_flight: int
    nacks: _containers.RepeatedCompositeFieldContainer[NackRequest]
    progress: _containers.RepeatedCompositeFieldContainer[Progress]
    subscribe: SubscribeRequest
    def __init__(self, subscribe: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., acks: _Optional[_Iterable[_Union[AckRequest, _Mapping]]] = ..., nacks: _Optional[_Iterable[_Union[NackRequest, _Mapping]]] = ..., extends: _Optional[_Iterable[_Union[ExtendLeaseRequest, _Mapping]]] = ..., max_in_flight: _Optional[int] = ..., confirm_settles: bool = ..., progress: _Optional[_Iterable[_Union[Progress, _Mapping]]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ["cancelled", "deliveries", "delivery", "heartbeat", "settled"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: Cancelled
    deliveries: Deliveries
    delivery: Delivery
    heartbeat: Heartbeat
    settled: SettleResults
    def __init__(self, delivery: _Optional[_Union[Delivery, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., settled: _Optional[_Union[SettleResults, _Mapping]] = ..., deliveries: _Optional[_Union[Deliveries, _Mapping]] = ..., cancelled: _Optional[_Union[Cancelled, _Mapping]] = ...) -> None: ...

class Deliveries(_message.Message):
    __slots__ = ["deliveries"]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ["job", "lease_expires_at", "lease_token"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job: Job
    lease_expires_at: _timestamp_pb2.Timestamp
    lease_token: str
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., lease_token: _Optional[str] = ..., lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ["jobs"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, jobs: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueResponse, _Mapping]]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ["dedup_key", "delay", "headers", "key", "max_attempts", "on_duplicate", "payload", "priority", "queue", "run_at", "ttl", "unique_for"]
    class HeadersEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ON_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_FOR_FIELD_NUMBER: _ClassVar[int]
    dedup_key: str
    delay: _duration_pb2.Duration
    headers: _containers.ScalarMap[str, str]
    key: str
    max_attempts: int
    on_duplicate: OnDuplicate
    payload: bytes
    priority: int
    queue: str
    run_at: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    unique_for: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., run_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., dedup_key: _Optional[str] = ..., max_attempts: _Optional[int] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., key: _Optional[str] = ..., unique_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., on_duplicate: _Optional[_Union[OnDuplicate, str]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ["duplicate", "job_id", "replaced"]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    job_id: str
    replaced: bool
    def __init__(self, job_id: _Optional[str] = ..., duplicate: bool = ..., replaced: bool = ...) -> None: ...

class ExtendLeaseRequest(_message.Message):
    __slots__ = ["job_id", "lease", "lease_token"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease: _duration_pb2.Duration
    lease_token: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., lease: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExtendLeaseResponse(_message.Message):
    __slots__ = ["lease_expires_at"]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ["features", "sent_at"]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    features: _containers.RepeatedScalarFieldContainer[str]
    sent_at: _timestamp_pb2.Timestamp
    def __init__(self, sent_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ["attempt", "enqueued_at", "headers", "id", "key", "last_error", "payload", "priority", "queue"]
    class HeadersEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    enqueued_at: _timestamp_pb2.Timestamp
    headers: _containers.ScalarMap[str, str]
    id: str
    key: str
    last_error: str
    payload: bytes
    priority: int
    queue: str
    def __init__(self, id: _Optional[str] = ..., queue: _Optional[str] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., attempt: _Optional[int] = ..., enqueued_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ["dead_letter", "error", "job_id", "lease_token", "retry_after"]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    dead_letter: bool
    error: str
    job_id: str
    lease_token: str
    retry_after: _duration_pb2.Duration
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., error: _Optional[str] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dead_letter: bool = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ["dead_lettered"]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    dead_lettered: bool
    def __init__(self, dead_lettered: bool = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ["id", "job"]
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    id: int
    job: EnqueueRequest
    def __init__(self, id: _Optional[int] = ..., job: _Optional[_Union[EnqueueRequest, _Mapping]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ["code", "enqueued", "id", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    enqueued: EnqueueResponse
    id: int
    message: str
    def __init__(self, id: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., enqueued: _Optional[_Union[EnqueueResponse, _Mapping]] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ["fraction", "job_id", "lease_token", "message"]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    fraction: float
    job_id: str
    lease_token: str
    message: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., fraction: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ["fraction", "job_id", "lease_token", "message"]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    fraction: float
    job_id: str
    lease_token: str
    message: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., fraction: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SettleResult(_message.Message):
    __slots__ = ["code", "dead_lettered", "enqueued", "job_id", "lease_expires_at", "lease_token", "message", "op"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    code: int
    dead_lettered: bool
    enqueued: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    lease_expires_at: _timestamp_pb2.Timestamp
    lease_token: str
    message: str
    op: SettleOp
    def __init__(self, job_id: _Optional[str] = ..., op: _Optional[_Union[SettleOp, str]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., dead_lettered: bool = ..., lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., lease_token: _Optional[str] = ..., enqueued: _Optional[_Iterable[str]] = ...) -> None: ...

class SettleResults(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SettleResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SettleResult, _Mapping]]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ["accept", "consumer", "lease", "max_in_flight", "queues"]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    accept: _containers.RepeatedScalarFieldContainer[str]
    consumer: str
    lease: _duration_pb2.Duration
    max_in_flight: int
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[str]] = ..., consumer: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., lease: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., accept: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ["cancelled", "deliveries", "delivery", "heartbeat"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    cancelled: Cancelled
    deliveries: Deliveries
    delivery: Delivery
    heartbeat: Heartbeat
    def __init__(self, delivery: _Optional[_Union[Delivery, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., deliveries: _Optional[_Union[Deliveries, _Mapping]] = ..., cancelled: _Optional[_Union[Cancelled, _Mapping]] = ...) -> None: ...

class WaitJobRequest(_message.Message):
    __slots__ = ["changes", "job_id", "timeout"]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    changes: bool
    job_id: str
    timeout: _duration_pb2.Duration
    def __init__(self, job_id: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., changes: bool = ...) -> None: ...

class WaitJobResponse(_message.Message):
    __slots__ = ["dead_reason", "finished_at", "job_id", "last_error", "result", "state"]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    dead_reason: str
    finished_at: _timestamp_pb2.Timestamp
    job_id: str
    last_error: str
    result: bytes
    state: WaitState
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[WaitState, str]] = ..., result: _Optional[bytes] = ..., last_error: _Optional[str] = ..., dead_reason: _Optional[str] = ..., finished_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WaitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OnDuplicate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class SettleOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
