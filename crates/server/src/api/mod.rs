//! gRPC services: thin handlers that validate, call the broker core and
//! convert back. Errors become `tonic::Status` only via `From<Error>`.

pub mod admin;
pub mod consume;
pub mod produce;
pub mod queue;
pub mod schedules;
