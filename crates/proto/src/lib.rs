//! leaseq's gRPC API, `leaseq.v1`: the messages, the generated clients
//! (`queue_service_client`, `admin_service_client`) and service traits
//! (`queue_service_server`, `admin_service_server`), compiled from
//! `proto/leaseq/v1/*.proto` (the repository's `proto/`, carried in the
//! published crate). The `.proto` files are the contract; [`limits`] holds
//! the numeric limits they document.

tonic::include_proto!("leaseq.v1");

/// Encoded descriptors of `leaseq.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/leaseq_descriptor.bin"));

/// Fixed limits of the contract, as documented in the `.proto` files: the
/// broker refuses requests beyond them, and clients clamp to them.
pub mod limits {
    use std::time::Duration;

    /// Queue names: 1 to this many characters.
    pub const MAX_QUEUE_LEN: usize = 128;
    /// Headers per job.
    pub const MAX_HEADERS: usize = 64;
    pub const MAX_HEADER_KEY_LEN: usize = 256;
    pub const MAX_HEADER_VALUE_LEN: usize = 16 * 1024;
    pub const MAX_DEDUP_KEY_LEN: usize = 512;
    /// A job's key inside its queue (`EnqueueRequest.key`), in bytes.
    pub const MAX_KEY_LEN: usize = 256;
    /// Most jobs of one key leased at once (`key_concurrency`, and a key
    /// override's `concurrency`).
    pub const MAX_KEY_CONCURRENCY: i32 = 1000;
    /// Named keys with settings of their own in one queue (`key_overrides`).
    pub const MAX_KEY_OVERRIDES: usize = 1000;
    /// A key override's `weight`: jobs of the key per turn of a fair round.
    pub const MAX_KEY_WEIGHT: i32 = 100;
    pub const MAX_CONSUMER_LEN: usize = 256;
    /// A Nack's `error`, in bytes.
    pub const MAX_ERROR_LEN: usize = 64 * 1024;
    pub const MAX_ATTEMPTS: i32 = 1000;
    /// Queues one stream may serve.
    pub const MAX_SUBSCRIBE_QUEUES: usize = 64;
    /// Credit of a stream that asks for none.
    pub const DEFAULT_MAX_IN_FLIGHT: u32 = 16;
    /// Most credit one stream may have.
    pub const MAX_IN_FLIGHT: u32 = 10_000;
    pub const MIN_LEASE: Duration = Duration::from_secs(1);
    pub const MAX_LEASE: Duration = Duration::from_secs(12 * 3600);
    /// Upper bound for delays, retry_after and ttl: ten years.
    pub const MAX_DELAY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);
    /// Upper bound for `EnqueueRequest.unique_for`, how long a completed
    /// job's dedup key stays held: 366 days.
    pub const MAX_UNIQUE_FOR: Duration = Duration::from_secs(366 * 24 * 3600);
    /// Entries of `SubscribeRequest.accept`, and bytes of each.
    pub const MAX_ACCEPT: usize = 32;
    pub const MAX_ACCEPT_LEN: usize = 64;
    /// Most deliveries in one `Deliveries` response.
    pub const MAX_BATCH_DELIVERIES: usize = 256;
    /// Most encoded bytes of one `Deliveries` response (a larger delivery
    /// travels alone). Packing saves per-message costs, which matter for
    /// small jobs only; the bound keeps a pack from moving more deliveries
    /// out of the broker's reach (into the transport's buffers, where a
    /// release cannot take them back) than single messages would.
    pub const MAX_BATCH_BYTES: usize = 64 * 1024;
}

/// What a client lists in `SubscribeRequest.accept` and a broker in its
/// first `Heartbeat.features` (docs/design/stream-messages.md).
pub mod features {
    /// Several deliveries in one `Deliveries` response.
    pub const DELIVERIES: &str = "deliveries";
    /// `Cancelled` responses when a held job is cancelled.
    pub const CANCEL: &str = "cancel";
    /// `AckRequest.enqueue`: an ack may carry follow-up jobs, inserted in
    /// the ack's transaction (a broker feature; clients send nothing for it
    /// in `accept`).
    pub const ACK_ENQUEUE: &str = "ack.enqueue";
    /// `AckRequest.result`: an ack may carry the job's result, kept on its
    /// completed record (a broker feature, as `ack.enqueue`).
    pub const ACK_RESULT: &str = "ack.result";
    /// `ConsumeRequest.progress`: a stream may report its jobs' progress
    /// (a broker feature).
    pub const PROGRESS: &str = "progress";
    /// Every feature this version of the contract defines, as a broker of
    /// this version announces them.
    pub const ALL: &[&str] = &[DELIVERIES, CANCEL, ACK_ENQUEUE, ACK_RESULT, PROGRESS];
}
