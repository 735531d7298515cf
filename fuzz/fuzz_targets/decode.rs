//! Bytes → protobuf decoding of each request type → the domain `parse()`
//! validation (and the bearer-token check). The first byte picks the request
//! type; see `leaseq_server::fuzzing`. Must never panic; every rejection must be a
//! client error code.
#![no_main]

use leaseq_server::fuzzing::decode_and_validate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let outcome = decode_and_validate(data);
    assert!(outcome.is_client_error_or_ok(), "{outcome:?}");
});
