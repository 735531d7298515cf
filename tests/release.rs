//! What a release is made of, checked on every run: one version for every
//! package (the Rust crates, the Python and Node packages, the Go module's
//! `Version`, the top entry of CHANGELOG.md), the license every manifest
//! names in LICENSE, and migrations that are only ever added
//! (migrations/SHA256SUMS). The packages themselves are built and installed
//! by the tests of each language: tests/client.rs (`cargo package`),
//! clients/python/tests/test_packaging.py (`python -m build`),
//! clients/node/test/package.test.js (`npm pack`), tests/go_example.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::common::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The value of `key = "..."` in the `[section]` of a TOML file (the few
/// plain lines this needs; no TOML parser in the tree).
fn toml_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(rest) = line.strip_prefix(key) {
            let rest = rest.trim_start();
            if let Some(v) = rest.strip_prefix('=') {
                return Some(v.trim().trim_matches('"').to_owned());
            }
        }
    }
    None
}

/// The quoted string after `pattern` on the first line holding it.
fn quoted_after(text: &str, pattern: &str) -> Option<String> {
    let at = text.find(pattern)? + pattern.len();
    let rest = &text[at..];
    let open = rest.find('"')? + 1;
    let close = rest[open..].find('"')? + open;
    Some(rest[open..close].to_owned())
}

#[test]
fn every_package_has_one_version() {
    let cargo = read("Cargo.toml");
    let version = toml_value(&cargo, "workspace.package", "version").expect("workspace version");
    let mut found = BTreeMap::new();
    for krate in ["leaseq-proto", "leaseq-client", "leaseq-server"] {
        let line = cargo
            .lines()
            .find(|l| l.starts_with(&format!("{krate} = ")))
            .unwrap_or_else(|| panic!("{krate} in [workspace.dependencies]"));
        found.insert(
            format!("Cargo.toml: {krate}'s path dependency"),
            quoted_after(line, "version = "),
        );
    }
    let pyproject = read("clients/python/pyproject.toml");
    found.insert(
        "clients/python/pyproject.toml".into(),
        toml_value(&pyproject, "project", "version"),
    );
    found.insert(
        "clients/python/leaseq/__init__.py: __version__".into(),
        quoted_after(&read("clients/python/leaseq/__init__.py"), "__version__ = "),
    );
    let json = |path: &str| -> serde_json::Value {
        serde_json::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let package = json("clients/node/package.json");
    found.insert(
        "clients/node/package.json".into(),
        package["version"].as_str().map(str::to_owned),
    );
    let lock = json("clients/node/package-lock.json");
    found.insert(
        "clients/node/package-lock.json".into(),
        lock["version"].as_str().map(str::to_owned),
    );
    found.insert(
        "clients/node/package-lock.json: packages[\"\"]".into(),
        lock["packages"][""]["version"].as_str().map(str::to_owned),
    );
    found.insert(
        "clients/go/worker/version.go: Version".into(),
        quoted_after(&read("clients/go/worker/version.go"), "const Version = "),
    );
    // The newest entry of the changelog: the first `## [X.Y.Z]` heading.
    let changelog = read("CHANGELOG.md");
    let top = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## ["))
        .and_then(|l| l.split(']').next())
        .map(str::to_owned);
    found.insert("CHANGELOG.md: the newest entry".into(), top);
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, v)| v.as_deref() != Some(version.as_str()))
        .map(|(k, v)| format!("{k}: {v:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the workspace is at {version}; these disagree:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn every_manifest_names_the_license_of_the_license_file() {
    let license = read("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is the Apache License 2.0"
    );
    let cargo = read("Cargo.toml");
    assert_eq!(
        toml_value(&cargo, "workspace.package", "license").as_deref(),
        Some("Apache-2.0")
    );
    for krate in ["crates/proto", "crates/client", "crates/server"] {
        let manifest = read(&format!("{krate}/Cargo.toml"));
        assert!(
            manifest.contains("license.workspace = true"),
            "{krate} takes the workspace's license"
        );
    }
    let pyproject = read("clients/python/pyproject.toml");
    assert!(
        pyproject.contains(r#"license = { text = "Apache-2.0" }"#),
        "pyproject.toml's license"
    );
    let package: serde_json::Value =
        serde_json::from_str(&read("clients/node/package.json")).unwrap();
    assert_eq!(package["license"], "Apache-2.0");
}

/// `migrations/SHA256SUMS` (the output of `sha256sum *.sql` in migrations/)
/// as (file, digest), in its order.
fn manifest() -> Vec<(String, String)> {
    read("migrations/SHA256SUMS")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (digest, file) = l
                .split_once("  ")
                .unwrap_or_else(|| panic!("not `DIGEST  FILE`: {l:?}"));
            (file.to_owned(), digest.to_owned())
        })
        .collect()
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A database applies each migration once and remembers its checksum: a
/// migration edited after it shipped fails every later start of a broker on
/// that database (sqlx: "previously applied but has been modified"), and one
/// deleted fails it too ("previously applied but is missing"; 98b0ff8 did
/// that). So migrations are only ever added, and this test holds the list:
/// adding a migration means adding its line (`sha256sum FILE >>
/// migrations/SHA256SUMS`); changing or removing a line is what it exists
/// to refuse.
#[test]
fn migrations_are_only_ever_added() {
    let dir = repo().join("migrations");
    let listed = manifest();
    let mut problems = Vec::new();
    for (file, digest) in &listed {
        let path = dir.join(file);
        if !path.exists() {
            problems.push(format!(
                "{file} is gone: a database that applied it no longer starts"
            ));
        } else if sha256_hex(&path) != *digest {
            problems.push(format!(
                "{file} changed: a database that applied it no longer starts; add a new migration instead"
            ));
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    on_disk.sort();
    for file in &on_disk {
        if !listed.iter().any(|(f, _)| f == file) {
            problems.push(format!(
                "{file} is not in migrations/SHA256SUMS: add it (cd migrations && sha256sum {file} >> SHA256SUMS)"
            ));
        }
    }
    let names: Vec<&String> = listed.iter().map(|(f, _)| f).collect();
    let mut sorted = names.clone();
    sorted.sort();
    if names != sorted {
        problems.push(
            "migrations/SHA256SUMS is not in version order: new migrations go at the end, with a later version"
                .into(),
        );
    }
    // The migrator embeds exactly these (sqlx::migrate! reads migrations/).
    let embedded: Vec<i64> = leaseq_server::store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    let versions: Vec<i64> = listed
        .iter()
        .map(|(f, _)| f.split('_').next().unwrap().parse().unwrap())
        .collect();
    if embedded != versions {
        problems.push(format!(
            "the migrator embeds {embedded:?}, the manifest lists {versions:?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A database migrated while 20261126000001_vacuum_truncate existed (it set
/// vacuum_truncate = false on the queue tables; 98b0ff8 deleted it) starts
/// again: the file is back as it was applied, and the next migration undoes
/// it, so it ends like a database migrated today.
#[tokio::test]
async fn a_database_migrated_before_the_deleted_migration_was_restored_starts() {
    let db = TestDb::new().await;
    // Whether leaseq.completed_jobs and leaseq.jobs keep their pages.
    let kept = async || -> Vec<bool> {
        sqlx::query_scalar(
            "select coalesce('vacuum_truncate=false' = any(reloptions), false) from pg_class
              where oid in ('leaseq.jobs'::regclass, 'leaseq.completed_jobs'::regclass)
              order by relname",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    assert_eq!(kept().await, [false, false], "migrated today");
    // Back to the state of a database migrated between a0128d8 and 98b0ff8:
    // the old migration applied (its row, with the checksum of the file as
    // it was then), the reset not yet.
    let applied: Vec<u8> = sqlx::query_scalar(
        "select checksum from leaseq._sqlx_migrations where version = 20261126000001",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the restored migration was applied");
    let then = sha384_of_applied_file();
    assert_eq!(applied, then, "the file is as it was when first applied");
    sqlx::raw_sql(
        "delete from leaseq._sqlx_migrations where version = 20261127000001;
         alter table leaseq.jobs set (vacuum_truncate = false);
         alter table leaseq.completed_jobs set (vacuum_truncate = false);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(kept().await, [true, true]);
    leaseq_server::store::migrate(&db.pool)
        .await
        .expect("a database migrated in between migrates");
    assert_eq!(
        kept().await,
        [false, false],
        "ends as a database migrated today"
    );
}

/// sqlx's checksum (SHA-384 of the file) of 20261126000001_vacuum_truncate
/// as 98b0ff8^ had it (`git show 98b0ff8^:migrations/...`).
fn sha384_of_applied_file() -> Vec<u8> {
    use sha2::Sha384;
    // The SHA-256 of that blob, pinned: the file must be byte for byte the
    // one databases applied.
    let path = repo().join("migrations/20261126000001_vacuum_truncate.sql");
    assert_eq!(
        sha256_hex(&path),
        "21cd5c6106ee5bcb51a9113fc23b613408a31fce14a712105db5b4596ce16645"
    );
    Sha384::digest(std::fs::read(path).unwrap()).to_vec()
}
