//! The Python and Node client suites (`clients/run-tests.sh`: pytest and
//! `node --test`) against this build's `leaseq` binary, so that `cargo test`
//! is the one command that runs every test. Needs python3 (with pip/venv) and
//! node (with npm); the script installs the clients' dependencies from PyPI
//! and npm on first use and prints each runner's summary.

use std::process::Command;

#[test]
fn the_python_client_passes_its_suite_against_a_live_broker() {
    run_suite("python");
}

/// The wheel built and installed into a fresh venv, and mypy --strict: the
/// slowest part of the Python suite, apart so that it runs beside the rest.
#[test]
fn the_python_package_installs_and_type_checks() {
    run_suite("packaging");
}

#[test]
fn the_node_client_passes_its_suite_against_a_live_broker() {
    run_suite("node");
}

/// `clients/run-tests.sh SUITE`: its own broker, then pytest or node --test.
/// A test per suite, so that nextest runs them at the same time.
fn run_suite(suite: &str) {
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new("bash")
        .arg(format!("{root}/clients/run-tests.sh"))
        .arg(suite)
        .current_dir(root)
        .env("LEASEQ_BIN", env!("CARGO_BIN_EXE_leaseq"))
        // The suites start their own broker on an embedded cluster unless
        // told otherwise; the Rust suite's DATABASE_URL is for that suite.
        .env_remove("DATABASE_URL")
        .status()
        .expect("running clients/run-tests.sh (needs bash)");
    assert!(
        status.success(),
        "the {suite} client suite failed ({status}); its output is above"
    );
}
