//! No script of the repository kills processes by name or pattern
//! (`pkill`, `killall`, `kill $(pgrep ...)`, `pidof ... | xargs kill`,
//! `ps ... | grep ... | xargs kill`, `fuser -k`): such a line stops every
//! matching process on the host, a user's broker or PostgreSQL included.
//! Scripts stop what they started by its recorded pid (scripts/bench/lib.sh)
//! and a cluster with `pg_ctl stop`.
//!
//! The scripts are every shell, Python, JavaScript, TypeScript and Go file
//! of the repository, and every file that starts with `#!` (test.sh, .ci/run,
//! deploy/check, scripts/sqlx-prepare), but for what tools install or build
//! (node_modules, virtualenvs, target, dist). Full-line comments are not
//! code. Also: every benchmark script is described in
//! scripts/bench/README.md. No build, no process: it reads the files.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const SCRIPT_EXTENSIONS: &[&str] = &["sh", "bash", "py", "js", "mjs", "cjs", "ts", "go"];

/// Every script of the repository, relative to its root.
fn scripts() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                let skip = name.starts_with('.') && name != ".ci"
                    || ["target", "node_modules", "dist", "__pycache__"].contains(&name.as_ref())
                    || name.contains("venv");
                if !skip {
                    walk(root, &path, out);
                }
                continue;
            }
            let by_extension = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| SCRIPT_EXTENSIONS.contains(&e));
            let by_shebang = path.extension().is_none()
                && std::fs::read(&path).is_ok_and(|bytes| bytes.starts_with(b"#!"));
            if by_extension || by_shebang {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let root = repo();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

/// Whether `word` occurs in `line` as a word of its own (not inside a
/// longer name: `kill` is not in `pkill` or `killall`, `ps` not in `pids`).
fn has_word(line: &str, word: &str) -> bool {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(is_name) && !after.is_some_and(is_name)
    })
}

/// Why `line` kills processes by name or pattern, if it does.
fn kills_by_pattern(line: &str) -> Option<&'static str> {
    let code = line.trim_start();
    if code.starts_with('#') || code.starts_with("//") {
        return None;
    }
    if has_word(code, "pkill") {
        return Some("pkill");
    }
    if has_word(code, "killall") {
        return Some("killall");
    }
    if has_word(code, "fuser") && code.contains("-k") {
        return Some("fuser -k");
    }
    let kills = has_word(code, "kill");
    if kills && has_word(code, "pgrep") {
        return Some("kill with pids from pgrep");
    }
    if kills && has_word(code, "pidof") {
        return Some("kill with pids from pidof");
    }
    if kills && has_word(code, "ps") && (has_word(code, "grep") || has_word(code, "awk")) {
        return Some("kill with pids from ps | grep");
    }
    None
}

#[test]
fn no_script_kills_processes_by_pattern() {
    let root = repo();
    let files = scripts();
    for must in [
        "test.sh",
        ".ci/run",
        "scripts/sqlx-prepare",
        "scripts/bench/lib.sh",
        "scripts/bench/sitting.sh",
        "clients/run-tests.sh",
    ] {
        assert!(
            files.iter().any(|f| f == Path::new(must)),
            "{must} was not scanned: the walk is broken ({} files)",
            files.len()
        );
    }
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = kills_by_pattern(line) {
                found.push(format!(
                    "{}:{}: {why}: {}",
                    file.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "scripts that kill processes by name or pattern (stop what the script started, by its \
         recorded pid: scripts/bench/lib.sh's spawn and stop; a cluster with pg_ctl stop):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_finds_every_way_of_killing_by_pattern() {
    for bad in [
        "pkill -f 'leaseq[^ ]* serve' ; sleep 1",
        "sleep 2; pkill -f \"postgres -D $D/data\"",
        "killall postgres",
        "kill $(pgrep -f floor_broker)",
        "pgrep -f leaseq | xargs kill -9",
        "kill -TERM $(pidof beam.smp)",
        "ps aux | grep '[l]easeq serve' | awk '{print $2}' | xargs kill",
        "fuser -k 50061/tcp",
        "    subprocess.run([\"pkill\", \"-f\", \"leaseq\"])",
        "exec.Command(\"killall\", \"leaseq\").Run()",
    ] {
        assert!(kills_by_pattern(bad).is_some(), "not found: {bad}");
    }
    for good in [
        "kill \"$A_PID\"; wait \"$A_PID\" 2>/dev/null",
        "kill -TERM \"$broker_pid\"",
        "for c in $(pgrep -P \"$1\" 2>/dev/null); do",
        "# never pkill -f: it stops every broker on the host",
        "// killall would stop a user's processes too",
        "stop \"$S_PID\"; sleep 1",
        "os.kill(pid, signal.SIGTERM)",
        "process.kill(child.pid)",
        "echo \"$pids\" | tr ' ' ','",
    ] {
        assert_eq!(kills_by_pattern(good), None, "{good}");
    }
}

/// scripts/bench/README.md says what each script of scripts/bench/ does:
/// a script added without a line there fails.
#[test]
fn every_bench_script_is_in_its_readme() {
    let dir = repo().join("scripts/bench");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut missing = Vec::new();
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "README.md" || e.path().is_dir() {
            continue;
        }
        seen += 1;
        if !readme.contains(&format!("[{name}]({name})")) {
            missing.push(name);
        }
    }
    assert!(seen >= 15, "only {seen} files in scripts/bench/");
    assert!(
        missing.is_empty(),
        "not in scripts/bench/README.md (as a link [NAME](NAME)): {missing:?}"
    );
}

/// A benchmark script under `set -e` whose own process died before the
/// end still stops everything else it started: the cleanup (an EXIT trap)
/// once stopped at the first `kill` of a pid already gone, and left the
/// older processes running (four brokers and their clusters, found half
/// an hour after a script had failed). Real bash, real processes: two
/// `sleep`s spawned, the newer killed by the script, then the script ends.
#[test]
fn a_set_e_script_whose_process_died_still_stops_the_others() {
    let out_dir = std::env::temp_dir().join(format!("leaseq-libsh-{}", std::process::id()));
    let script = format!(
        r#"set -euo pipefail
. "{lib}"
bench_init "{out}"
spawn "$OUT/a.log" sleep 300
echo "$SPAWNED" >"$OUT/older.pid"
spawn "$OUT/b.log" sleep 300
kill -KILL "$SPAWNED"
wait "$SPAWNED" 2>/dev/null || true
"#,
        lib = repo().join("scripts/bench/lib.sh").display(),
        out = out_dir.display(),
    );
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        // No broker is run: any executable stands in for the release
        // binary bench_init insists on (a clean checkout has none).
        .env("BIN", "/bin/sh")
        .status()
        .expect("bash");
    let pid: i32 = std::fs::read_to_string(out_dir.join("older.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ");
    if alive {
        // SAFETY: kill(2) on the sleep this test's script started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(!alive, "the older process ({pid}) was left running");
    assert!(status.success(), "the script's exit: {status}");
}
