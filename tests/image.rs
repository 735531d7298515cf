//! deploy/Dockerfile without a Docker engine: its build stage replayed on
//! this machine from exactly the files its COPY lines name, and the runtime
//! stage's health check run against the binary that build made.
//!
//! The replay parses the Dockerfile, lays the files of the build stage's
//! COPY lines out in a fresh directory as the image's file system would
//! hold them (nothing else: a file the build needs that no COPY brings
//! fails it, as `docker build` would), and runs the stage's cargo command
//! there with the stage's environment (the Rust image's: none of this
//! process's variables, so no SQLX_OFFLINE or DATABASE_URL from outside),
//! offline, from the registry already downloaded. Two differences, both
//! for time: the build is a debug build (`--release` dropped: a release
//! build of every dependency is minutes of CPU, and which files a build
//! reads does not depend on the profile), and its target directory starts
//! with the dependencies this test binary was built with (hard links), so
//! it compiles leaseq's own four crates, which read every copied file.
//! The image's own path from that build's output to its entry point
//! (`cp target/release/leaseq ...`, `COPY --from=build`) is checked as
//! text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

/// One instruction: its keyword and the rest of its line (continuations
/// joined).
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug, Default)]
struct Stage {
    name: Option<String>,
    from: String,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all(&self, keyword: &str) -> impl Iterator<Item = &str> {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    /// ENV lines as KEY=VALUE pairs (the `ENV K=V K2=V2` form).
    fn env(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for args in self.all("ENV") {
            for pair in args.split_whitespace() {
                let (k, v) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("ENV {args}: only KEY=VALUE is replayed"));
                out.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
        out
    }
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if trimmed.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in lines {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_owned();
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => panic!("FROM {args}: not replayed"),
            };
            stages.push(Stage {
                name,
                from: words[0].to_owned(),
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("an instruction before FROM")
                .instructions
                .push(Instruction { keyword, args });
        }
    }
    stages
}

/// `--flag=value` words at the start of `args`, and the rest.
fn flags(args: &str) -> (Vec<&str>, Vec<&str>) {
    let words: Vec<&str> = args.split_whitespace().collect();
    let n = words.iter().take_while(|w| w.starts_with("--")).count();
    (words[..n].to_vec(), words[n..].to_vec())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Copies `src` to `dst` as `COPY` does: a directory's contents into `dst`
/// (symbolic links as links), a file as `dst`.
fn copy_in(src: &Path, dst: &Path) {
    let meta = std::fs::symlink_metadata(src)
        .unwrap_or_else(|e| panic!("COPY {}: {e} (not in the build context)", src.display()));
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src).unwrap();
        std::os::unix::fs::symlink(target, dst).unwrap();
    } else if meta.is_dir() {
        std::fs::create_dir_all(dst).unwrap();
        for entry in std::fs::read_dir(src).unwrap() {
            let entry = entry.unwrap();
            copy_in(&entry.path(), &dst.join(entry.file_name()));
        }
    } else {
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::copy(src, dst).unwrap();
    }
}

/// Lays out the build stage's COPY lines under `root` (the image's `/`).
fn replay_copies(stage: &Stage, root: &Path) -> PathBuf {
    let workdir = stage
        .all("WORKDIR")
        .last()
        .expect("the build stage sets a WORKDIR")
        .to_owned();
    assert!(workdir.starts_with('/'), "WORKDIR {workdir}: absolute");
    let work = root.join(workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&work).unwrap();
    let context = repo();
    assert!(
        !context.join(".dockerignore").exists(),
        "a .dockerignore now leaves files out of the context: replay it here too"
    );
    for args in stage.all("COPY") {
        let (flags, words) = flags(args);
        assert!(flags.is_empty(), "COPY {args}: flags are not replayed");
        assert!(words.len() >= 2, "COPY {args}");
        let (dest, srcs) = words.split_last().unwrap();
        let dest = if dest.starts_with('/') {
            root.join(dest.trim_start_matches('/'))
        } else {
            work.join(dest)
        };
        for src in srcs {
            assert!(
                !src.contains(['*', '?', '[']),
                "COPY {args}: wildcards are not replayed"
            );
            let from = context.join(src);
            let into_dir = srcs.len() > 1 || args.ends_with('/');
            let to = if into_dir && !from.is_dir() {
                dest.join(from.file_name().unwrap())
            } else {
                dest.clone()
            };
            copy_in(&from, &to);
        }
    }
    work
}

/// Entries of `dir` that are not leaseq's own (its crates are built by the
/// replay from the copied files, never taken from the seed).
fn seed_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !(name.starts_with("leaseq")
                || name.starts_with("libleaseq")
                || name.starts_with("suite-"))
        })
        .collect()
}

/// A target directory for the replay holding the dependencies this test
/// binary was built with: the compiled libraries hard-linked (rustc
/// replaces an output it rebuilds, it does not write into it), the small
/// files (build script outputs, fingerprints, dep-info) copied, timestamps
/// kept, so cargo finds them fresh.
fn seeded_target(profile_dir: &Path, target: &Path) {
    let debug = target.join("debug");
    for sub in ["deps", "build", ".fingerprint"] {
        std::fs::create_dir_all(debug.join(sub)).unwrap();
    }
    let cp = |args: &[&str], paths: Vec<PathBuf>, into: &Path| {
        if paths.is_empty() {
            return;
        }
        let status = std::process::Command::new("cp")
            .args(args)
            .args(&paths)
            .arg(into)
            .status()
            .expect("cp");
        assert!(status.success(), "cp {args:?} into {}", into.display());
    };
    let (linked, copied): (Vec<PathBuf>, Vec<PathBuf>) = seed_entries(&profile_dir.join("deps"))
        .into_iter()
        .partition(|p| {
            p.extension()
                .is_some_and(|e| e == "rlib" || e == "rmeta" || e == "so")
        });
    cp(&["-al"], linked, &debug.join("deps"));
    cp(&["-a"], copied, &debug.join("deps"));
    for sub in ["build", ".fingerprint"] {
        cp(
            &["-a"],
            seed_entries(&profile_dir.join(sub)),
            &debug.join(sub),
        );
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The environment of the build stage: the Rust image's (its PATH, HOME,
/// CARGO_HOME and RUSTUP_HOME, here this machine's toolchain and registry)
/// and the stage's ENV lines; nothing else.
fn build_env(stage: &Stage) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    env.extend(stage.env());
    env
}

#[tokio::test]
async fn the_image_build_stage_builds_from_its_copied_files_and_the_health_check_works() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    let stages = parse_dockerfile(&dockerfile);
    let runtime = stages.last().expect("a stage");
    // The stage the runtime stage copies the binary from.
    let copy_from = runtime
        .all("COPY")
        .find_map(|a| {
            let (flags, words) = flags(a);
            let from = flags.iter().find_map(|f| f.strip_prefix("--from="))?;
            Some((from.to_owned(), words[0].to_owned(), words[1].to_owned()))
        })
        .expect("the runtime stage copies from the build stage");
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some(copy_from.0.as_str()))
        .expect("the build stage");
    assert!(build.from.starts_with("rust:"), "{}", build.from);

    // The build stage's command: `cargo ARGS && cp OUT BIN`.
    let runs: Vec<&str> = build.all("RUN").collect();
    assert_eq!(runs.len(), 1, "one RUN in the build stage: {runs:?}");
    let (_, words) = flags(runs[0]);
    let command = words.join(" ");
    let steps: Vec<&str> = command.split("&&").map(str::trim).collect();
    let cargo: Vec<&str> = steps[0].split_whitespace().collect();
    assert_eq!(cargo[..2], ["cargo", "build"], "{command}");
    assert!(cargo.contains(&"--release"), "{command}");
    let bin = cargo[cargo.iter().position(|w| *w == "--bin").expect("--bin") + 1];
    assert_eq!(
        steps.get(1).copied(),
        Some(format!("cp target/release/{bin} {}", copy_from.1).as_str()),
        "the runtime stage copies the binary cargo builds"
    );
    let entry = runtime.all("ENTRYPOINT").last().expect("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry).expect("ENTRYPOINT [..]");
    assert_eq!(
        entry,
        std::slice::from_ref(&copy_from.2),
        "the entry point is that binary"
    );

    // The build stage's files, alone.
    let fs_root = Scratch::new("image-build");
    let workdir = replay_copies(build, fs_root.dir());
    let profile_dir = Path::new(env!("CARGO_BIN_EXE_leaseq"))
        .parent()
        .unwrap()
        .to_owned();
    let target = RemoveOnDrop(
        profile_dir
            .parent()
            .unwrap()
            .join(format!("image-replay-{}", uuid::Uuid::new_v4().simple())),
    );
    seeded_target(&profile_dir, &target.0);

    let args: Vec<&str> = cargo[1..]
        .iter()
        .copied()
        .filter(|w| *w != "--release")
        .collect();
    let started = std::time::Instant::now();
    let out = tokio::process::Command::new("cargo")
        .args(&args)
        .current_dir(&workdir)
        .env_clear()
        .envs(build_env(build))
        .env("CARGO_TARGET_DIR", &target.0)
        .env("CARGO_NET_OFFLINE", "true")
        .env("CARGO_INCREMENTAL", "0")
        // No debug info for the four crates it compiles: the replay checks
        // that they build from the copied files (the image's own build is a
        // release one), and the dependencies have none in the dev profile
        // already, so the seeded ones stay fresh. 43 s of CPU with it, 36
        // without, on an idle host.
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(540), out)
        .await
        .expect("the replayed build finishes within 9 minutes")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the image's build stage fails from the files it copies (cargo {}):\n{stderr}",
        args.join(" ")
    );
    let compiled: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Compiling "))
        .collect();
    eprintln!(
        "replayed `cargo {}` in {:.0?}: compiled {compiled:?}",
        args.join(" "),
        started.elapsed()
    );
    for krate in ["leaseq-proto", "leaseq-client", "leaseq-server", "leaseq v"] {
        assert!(
            compiled.iter().any(|c| c.starts_with(krate)),
            "{krate} was compiled from the copied files: {compiled:?}"
        );
    }
    let binary = target.0.join("debug").join(bin);

    // The libraries it needs are in debian:bookworm-slim (libc6, libgcc-s1).
    let ldd = std::process::Command::new("ldd")
        .arg(&binary)
        .output()
        .unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    for lib in ldd.lines().filter_map(|l| l.split_whitespace().next()) {
        let name = lib.rsplit('/').next().unwrap();
        assert!(
            [
                "linux-vdso.so.1",
                "libgcc_s.so.1",
                "libm.so.6",
                "libc.so.6",
                "libpthread.so.0",
                "libdl.so.2",
                "librt.so.1",
                "ld-linux-x86-64.so.2",
                "ld-linux-aarch64.so.1",
                "linux-vdso.so.1",
            ]
            .contains(&name),
            "{bin} needs {lib}, which debian:bookworm-slim lacks:\n{ldd}"
        );
    }

    // The runtime stage's health check, with its environment, against
    // `serve` from that binary: failing before the broker serves, passing
    // once it does.
    let hc = runtime.all("HEALTHCHECK").last().expect("a HEALTHCHECK");
    let cmd = &hc[hc.find("CMD ").expect("HEALTHCHECK ... CMD [..]") + 4..];
    let cmd: Vec<String> = serde_json::from_str(cmd.trim()).expect("CMD in exec form");
    assert_eq!(
        cmd[0], copy_from.2,
        "the health check runs the image's binary"
    );
    let mut env = runtime.env();
    assert!(env.contains_key("LEASEQ_LISTEN"), "{env:?}");
    // Its port here: the image's 50051 may be taken on this machine.
    let addr = format!("127.0.0.1:{}", free_port());
    env.insert("LEASEQ_LISTEN".into(), addr.clone());
    let check = async || {
        tokio::process::Command::new(&binary)
            .args(&cmd[1..])
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap()
    };
    let before = check().await;
    assert_eq!(before.status.code(), Some(4), "no broker yet: {before:?}");

    let db = TestDb::new().await;
    let mut serve = tokio::process::Command::new(&binary)
        .args(["serve", "--health-interval", "200ms"])
        .env_clear()
        .envs(&env)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_serving(addr.parse().unwrap(), Duration::from_secs(60)).await;
    let after = check().await;
    assert!(after.status.success(), "SERVING: {after:?}");
    assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), "SERVING");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(serve.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(30), serve.wait())
        .await
        .expect("drains")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn the_dockerfile_parser_reads_what_the_replay_needs() {
    let stages = parse_dockerfile(
        "# c\nFROM a:1 AS build\nWORKDIR /src\nCOPY x y ./\nRUN --mount=type=cache,target=/t \\\n    # inside\n    cargo build --release \\\n    && cp a b\nFROM b\nENV A=1 \\\n    B=\"2\"\nUSER 10001\n",
    );
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0].name.as_deref(), Some("build"));
    assert_eq!(stages[0].all("COPY").collect::<Vec<_>>(), ["x y ./"]);
    let run = stages[0].all("RUN").next().unwrap();
    let (f, w) = flags(run);
    assert_eq!(f, ["--mount=type=cache,target=/t"]);
    assert_eq!(w.join(" "), "cargo build --release && cp a b");
    assert_eq!(
        stages[1].env(),
        BTreeMap::from([("A".into(), "1".into()), ("B".into(), "2".into())])
    );
}
