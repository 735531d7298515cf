//! The Prometheus alerting rules and the Grafana dashboard in deploy/:
//! `promtool check rules` and `promtool test rules` (unit tests that make
//! each alert fire, and stay quiet when it should), `promtool check config`
//! of the compose file's Prometheus, and every dashboard query parsed as
//! PromQL by promtool. That every series they use is one the broker
//! exposes is checked against a live scrape in tests/metrics.rs.
//!
//! Needs `promtool` (Debian package `prometheus`): fails, never skips,
//! without it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("promtool"))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "promtool is not installed: the alerting-rule tests need Debian's `prometheus` \
             package (apt-get install -y prometheus)"
        )
    })
}

/// Runs promtool with `args` in `dir`; panics with its output on failure.
fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alerting_rules_pass_promtool_check() {
    let out = run(
        &deploy().join("prometheus"),
        &["check", "rules", "alerts.yml"],
    );
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
}

#[test]
fn alerting_rules_fire_when_they_should() {
    let out = run(
        &deploy().join("prometheus"),
        &["test", "rules", "alerts_test.yml"],
    );
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has at least one unit test that expects it to fire.
    let rules = std::fs::read_to_string(deploy().join("prometheus/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(deploy().join("prometheus/alerts_test.yml")).unwrap();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "alerts_test.yml tests {name}"
            );
        }
    }
}

#[test]
fn compose_prometheus_config_is_valid() {
    let out = run(
        &deploy().join("prometheus"),
        &["check", "config", "prometheus.yml"],
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every panel query of the dashboard, with Grafana's variables filled in,
/// parses as PromQL (as recording rules checked by promtool).
#[test]
fn dashboard_queries_are_valid_promql() {
    let text = std::fs::read_to_string(deploy().join("grafana/leaseq-dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "leaseq-overview");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = std::collections::HashSet::new();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    for p in panels {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "panel ids are unique"
        );
        assert!(p["gridPos"]["w"].as_i64().unwrap() > 0);
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a PromQL target");
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$queue", ".*");
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            n += 1;
            rules.push_str(&format!(
                "      - record: dashboard:query_{n}\n        expr: {}\n",
                serde_json::to_string(&expr).unwrap()
            ));
        }
    }
    assert!(n >= 15, "{n} queries");
    let dir = std::env::temp_dir().join(format!("leaseq-dash-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard-rules.yml"), rules).unwrap();
    let out = run(&dir, &["check", "rules", "dashboard-rules.yml"]);
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
