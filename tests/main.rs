//! The integration suite as one test binary (`[[test]] name = "suite"` in
//! Cargo.toml, `autotests = false`): one link instead of one per file. Each
//! file below is a module and keeps its own subject; `common` is the shared harness (PostgreSQL, brokers,
//! admin clients, snapshots, fault load). Run one file's tests with a filter:
//! `cargo nextest run -E 'test(/^lb::/)'` or `cargo test --test suite lb::`.

// A scenario reads top to bottom: test functions may be long (the code
// they test may not: clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

mod ack_enqueue;
mod admin;
mod admin_cli;
mod alerts;
mod client;
mod client_cli;
mod client_effects;
mod client_results;
mod clients;
mod conn_limits;
mod console;
mod consume;
mod dedup;
mod docs;
mod embedded_pg;
mod faults;
mod fuzz_decode;
mod go_example;
mod guarantee;
mod house;
mod image;
mod key_limits;
mod keys;
mod keys_admin;
mod lb;
mod limits;
mod metrics;
mod migrate_cli;
mod pg_connect;
mod plans;
mod process;
mod produce;
mod progress;
mod release;
mod results;
mod scaling;
mod schedules;
mod scripts;
mod security;
mod semantics;
mod sql_ack;
mod sql_enqueue;
mod traces;
mod validation;
mod wait_job;
mod work;

/// With `autotests = false`, a new file under tests/ that is not declared
/// above would never be compiled or run, silently: this fails instead.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).expect("reading tests/main.rs");
    let declared: std::collections::HashSet<&str> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading tests/") {
        let path = entry.expect("tests/ entry").path();
        let is_rs = path.extension().is_some_and(|e| e == "rs");
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if is_rs && stem != "main" && !declared.contains(stem) {
            missing.push(stem.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{{{}}}.rs not declared in tests/main.rs (add `mod NAME;`): they would not run",
        missing.join(",")
    );
    assert!(declared.len() >= 17, "{declared:?}");
}
