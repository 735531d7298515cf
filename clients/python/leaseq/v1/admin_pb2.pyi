from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CATCH_UP_POLICY_ALL: CatchUpPolicy
CATCH_UP_POLICY_NONE: CatchUpPolicy
CATCH_UP_POLICY_ONE: CatchUpPolicy
CATCH_UP_POLICY_UNSPECIFIED: CatchUpPolicy
DESCRIPTOR: _descriptor.FileDescriptor
JOB_STATE_AVAILABLE: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_DEAD: JobState
JOB_STATE_LEASED: JobState
JOB_STATE_SCHEDULED: JobState
JOB_STATE_UNSPECIFIED: JobState
KEY_ORDER_KEY: KeyOrder
KEY_ORDER_UNSPECIFIED: KeyOrder
KEY_ORDER_WAITING: KeyOrder
OVERLAP_POLICY_ALLOW: OverlapPolicy
OVERLAP_POLICY_SKIP: OverlapPolicy
OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy

class CancelJobRequest(_message.Message):
    __slots__ = ["job_id"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ["was_leased"]
    WAS_LEASED_FIELD_NUMBER: _ClassVar[int]
    was_leased: bool
    def __init__(self, was_leased: bool = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ["schedule"]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeadLettersSelector(_message.Message):
    __slots__ = ["all", "ids", "queue"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    all: bool
    ids: _containers.RepeatedScalarFieldContainer[str]
    queue: str
    def __init__(self, queue: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., all: bool = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ["job_id"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ["queue"]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ["attempt", "completed_at", "completed_by", "dead_reason", "dedup_key", "died_at", "enqueued_at", "expires_at", "headers", "id", "key", "last_error", "lease_expires_at", "leased_by", "max_attempts", "payload", "priority", "progress", "progress_at", "progress_message", "queue", "result", "run_at", "state"]
    class HeadersEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_BY_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    DIED_AT_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASED_BY_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    completed_at: _timestamp_pb2.Timestamp
    completed_by: str
    dead_reason: str
    dedup_key: str
    died_at: _timestamp_pb2.Timestamp
    enqueued_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    headers: _containers.ScalarMap[str, str]
    id: str
    key: str
    last_error: str
    lease_expires_at: _timestamp_pb2.Timestamp
    leased_by: str
    max_attempts: int
    payload: bytes
    priority: int
    progress: float
    progress_at: _timestamp_pb2.Timestamp
    progress_message: str
    queue: str
    result: bytes
    run_at: _timestamp_pb2.Timestamp
    state: JobState
    def __init__(self, id: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., dedup_key: _Optional[str] = ..., enqueued_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., key: _Optional[str] = ..., run_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., leased_by: _Optional[str] = ..., lease_expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., dead_reason: _Optional[str] = ..., died_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., completed_by: _Optional[str] = ..., result: _Optional[bytes] = ..., progress: _Optional[float] = ..., progress_message: _Optional[str] = ..., progress_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JobTemplate(_message.Message):
    __slots__ = ["headers", "max_attempts", "payload", "priority", "queue", "ttl"]
    class HeadersEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.ScalarMap[str, str]
    max_attempts: int
    payload: bytes
    priority: int
    queue: str
    ttl: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., max_attempts: _Optional[int] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ["key", "leased", "oldest_available_age", "waiting"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AVAILABLE_AGE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    key: str
    leased: int
    oldest_available_age: _duration_pb2.Duration
    waiting: int
    def __init__(self, key: _Optional[str] = ..., waiting: _Optional[int] = ..., leased: _Optional[int] = ..., oldest_available_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class KeyOverride(_message.Message):
    __slots__ = ["concurrency", "key", "rate_limit", "weight"]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    concurrency: int
    key: str
    rate_limit: float
    weight: int
    def __init__(self, key: _Optional[str] = ..., concurrency: _Optional[int] = ..., rate_limit: _Optional[float] = ..., weight: _Optional[int] = ...) -> None: ...

class KeyOverrides(_message.Message):
    __slots__ = ["overrides"]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[KeyOverride]
    def __init__(self, overrides: _Optional[_Iterable[_Union[KeyOverride, _Mapping]]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ["include_payload", "page_size", "page_token", "queue"]
    INCLUDE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    include_payload: bool
    page_size: int
    page_token: str
    queue: str
    def __init__(self, queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_payload: bool = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ["include_payload", "key", "page_size", "page_token", "queue", "state"]
    INCLUDE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    include_payload: bool
    key: str
    page_size: int
    page_token: str
    queue: str
    state: JobState
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_payload: bool = ..., key: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ["jobs", "next_page_token", "unavailable_clusters"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    next_page_token: str
    unavailable_clusters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unavailable_clusters: _Optional[_Iterable[str]] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ["order", "page_size", "page_token", "queue"]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    order: KeyOrder
    page_size: int
    page_token: str
    queue: str
    def __init__(self, queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., order: _Optional[_Union[KeyOrder, str]] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ["keys", "next_page_token", "unavailable_clusters"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    next_page_token: str
    unavailable_clusters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unavailable_clusters: _Optional[_Iterable[str]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ["page_size", "page_token"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ["next_page_token", "queues", "unavailable_clusters"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    unavailable_clusters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unavailable_clusters: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ["page_size", "page_token"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ["next_page_token", "schedules"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    schedules: _containers.RepeatedCompositeFieldContainer[ScheduleInfo]
    def __init__(self, schedules: _Optional[_Iterable[_Union[ScheduleInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PauseQueueRequest(_message.Message):
    __slots__ = ["queue"]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ["purged"]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ["queue"]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ["purged", "purged_completed"]
    PURGED_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    purged_completed: int
    def __init__(self, purged: _Optional[int] = ..., purged_completed: _Optional[int] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ["created_at", "name", "settings", "stats"]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    created_at: _timestamp_pb2.Timestamp
    name: str
    settings: QueueSettings
    stats: QueueStats
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., stats: _Optional[_Union[QueueStats, _Mapping]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ["backoff_base", "backoff_cap", "completed_retention", "concurrency_limit", "default_lease", "fair_by_key", "key_concurrency", "key_overrides", "key_rate_burst", "key_rate_limit", "max_attempts", "ordered_by_key", "paused", "rate_burst", "rate_limit"]
    BACKOFF_BASE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_CAP_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_RETENTION_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_LEASE_FIELD_NUMBER: _ClassVar[int]
    FAIR_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KEY_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_BURST_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ORDERED_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RATE_BURST_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    backoff_base: _duration_pb2.Duration
    backoff_cap: _duration_pb2.Duration
    completed_retention: _duration_pb2.Duration
    concurrency_limit: int
    default_lease: _duration_pb2.Duration
    fair_by_key: bool
    key_concurrency: int
    key_overrides: _containers.RepeatedCompositeFieldContainer[KeyOverride]
    key_rate_burst: int
    key_rate_limit: float
    max_attempts: int
    ordered_by_key: bool
    paused: bool
    rate_burst: int
    rate_limit: float
    def __init__(self, default_lease: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., backoff_base: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., backoff_cap: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., completed_retention: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., paused: bool = ..., concurrency_limit: _Optional[int] = ..., rate_limit: _Optional[float] = ..., rate_burst: _Optional[int] = ..., ordered_by_key: bool = ..., key_concurrency: _Optional[int] = ..., fair_by_key: bool = ..., key_rate_limit: _Optional[float] = ..., key_rate_burst: _Optional[int] = ..., key_overrides: _Optional[_Iterable[_Union[KeyOverride, _Mapping]]] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ["available", "consumers", "dead", "keys_leased", "keys_waiting", "keys_waiting_capped", "leased", "oldest_available_age", "scheduled", "streams"]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    KEYS_LEASED_FIELD_NUMBER: _ClassVar[int]
    KEYS_WAITING_CAPPED_FIELD_NUMBER: _ClassVar[int]
    KEYS_WAITING_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AVAILABLE_AGE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    available: int
    consumers: int
    dead: int
    keys_leased: int
    keys_waiting: int
    keys_waiting_capped: bool
    leased: int
    oldest_available_age: _duration_pb2.Duration
    scheduled: int
    streams: int
    def __init__(self, available: _Optional[int] = ..., scheduled: _Optional[int] = ..., leased: _Optional[int] = ..., dead: _Optional[int] = ..., oldest_available_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., streams: _Optional[int] = ..., consumers: _Optional[int] = ..., keys_waiting: _Optional[int] = ..., keys_leased: _Optional[int] = ..., keys_waiting_capped: bool = ...) -> None: ...

class RequeueDeadLettersResponse(_message.Message):
    __slots__ = ["requeued", "skipped_duplicates"]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    skipped_duplicates: int
    def __init__(self, requeued: _Optional[int] = ..., skipped_duplicates: _Optional[int] = ...) -> None: ...

class ResumeQueueRequest(_message.Message):
    __slots__ = ["queue"]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RunScheduleRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RunScheduleResponse(_message.Message):
    __slots__ = ["job_id", "tick_at"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TICK_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    tick_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., tick_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ["catch_up", "catch_up_limit", "cron", "job", "name", "overlap", "paused", "time_zone"]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    catch_up: CatchUpPolicy
    catch_up_limit: int
    cron: str
    job: JobTemplate
    name: str
    overlap: OverlapPolicy
    paused: bool
    time_zone: str
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., job: _Optional[_Union[JobTemplate, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., catch_up: _Optional[_Union[CatchUpPolicy, str]] = ..., catch_up_limit: _Optional[int] = ..., paused: bool = ...) -> None: ...

class ScheduleInfo(_message.Message):
    __slots__ = ["created_at", "last_job_id", "last_tick_at", "next_run_at", "schedule", "updated_at"]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_TICK_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_RUN_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    created_at: _timestamp_pb2.Timestamp
    last_job_id: str
    last_tick_at: _timestamp_pb2.Timestamp
    next_run_at: _timestamp_pb2.Timestamp
    schedule: Schedule
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., next_run_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_tick_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_job_id: _Optional[str] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ["backoff_base", "backoff_cap", "completed_retention", "concurrency_limit", "create", "default_lease", "fair_by_key", "key_concurrency", "key_overrides", "key_rate_burst", "key_rate_limit", "max_attempts", "ordered_by_key", "paused", "queue", "rate_burst", "rate_limit"]
    BACKOFF_BASE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_CAP_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_RETENTION_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_LEASE_FIELD_NUMBER: _ClassVar[int]
    FAIR_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KEY_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_BURST_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ORDERED_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RATE_BURST_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    backoff_base: _duration_pb2.Duration
    backoff_cap: _duration_pb2.Duration
    completed_retention: _duration_pb2.Duration
    concurrency_limit: int
    create: bool
    default_lease: _duration_pb2.Duration
    fair_by_key: bool
    key_concurrency: int
    key_overrides: KeyOverrides
    key_rate_burst: int
    key_rate_limit: float
    max_attempts: int
    ordered_by_key: bool
    paused: bool
    queue: str
    rate_burst: int
    rate_limit: float
    def __init__(self, queue: _Optional[str] = ..., default_lease: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., backoff_base: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., backoff_cap: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., completed_retention: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., paused: bool = ..., create: bool = ..., concurrency_limit: _Optional[int] = ..., rate_limit: _Optional[float] = ..., rate_burst: _Optional[int] = ..., ordered_by_key: bool = ..., key_concurrency: _Optional[int] = ..., fair_by_key: bool = ..., key_rate_limit: _Optional[float] = ..., key_rate_burst: _Optional[int] = ..., key_overrides: _Optional[_Union[KeyOverrides, _Mapping]] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ["catch_up", "catch_up_limit", "cron", "job", "name", "overlap", "paused", "time_zone"]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    catch_up: CatchUpPolicy
    catch_up_limit: int
    cron: str
    job: JobTemplate
    name: str
    overlap: OverlapPolicy
    paused: bool
    time_zone: str
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., job: _Optional[_Union[JobTemplate, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., catch_up: _Optional[_Union[CatchUpPolicy, str]] = ..., catch_up_limit: _Optional[int] = ..., paused: bool = ...) -> None: ...

class WatchQueuesRequest(_message.Message):
    __slots__ = ["interval", "queues"]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    interval: _duration_pb2.Duration
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[str]] = ..., interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WatchQueuesResponse(_message.Message):
    __slots__ = ["queues", "sent_at", "unavailable_clusters"]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    sent_at: _timestamp_pb2.Timestamp
    unavailable_clusters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., sent_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., unavailable_clusters: _Optional[_Iterable[str]] = ...) -> None: ...

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class KeyOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OverlapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CatchUpPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
