//! The console's Schedules page (issue 34) in Chromium: the schedules of
//! the queues a session may read, with their cron, zone, next and last
//! tick, pause and policies; pause, resume, run now and a confirmed delete
//! for sessions with `admin` on a schedule's queue, no action for the
//! others, and the server refusing what their page does not offer.

use std::time::Duration;

use super::*;
use leaseq::pb::admin_service_client::AdminServiceClient;

/// A token with `admin` on the queue `reports` only.
const REPORTS: &str = "reports-console-secret-0123456789";

/// ops: admin everywhere; viewer: consume everywhere (read-only); reports:
/// admin on `reports` only (it sees no other queue).
fn schedules_auth_file() -> (Scratch, PathBuf) {
    let h = leaseq_server::hash_token;
    let text = json!({"tokens": [
        {"name": "ops", "sha256": h(ADMIN), "grants": [{"queues": "*", "actions": ["admin"]}]},
        {"name": "viewer", "sha256": h(VIEWER), "grants": [{"queues": "*", "actions": ["consume"]}]},
        {"name": "reports", "sha256": h(REPORTS),
         "grants": [{"queues": "reports", "actions": ["admin"]}]},
    ]});
    Scratch::with_file("con", "tokens.json", &text.to_string())
}

async fn admin_client(broker: &TestBroker) -> AdminServiceClient<ClientChannel> {
    let sec = ClientSecurity {
        token: Some(ADMIN.to_owned()),
        ..Default::default()
    };
    AdminServiceClient::new(
        leaseq::cli::connect(&format!("http://{}", broker.addr), &sec)
            .await
            .unwrap(),
    )
}

async fn get_schedule(
    admin: &mut AdminServiceClient<ClientChannel>,
    name: &str,
) -> Result<pb::ScheduleInfo, tonic::Status> {
    admin
        .get_schedule(pb::GetScheduleRequest { name: name.into() })
        .await
        .map(|r| r.into_inner())
}

/// As the page shows a time: `2026-11-29 03:30:00Z`.
fn shown(t: &Option<prost_types::Timestamp>) -> String {
    let t = t.as_ref().expect("a time");
    chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32)
        .unwrap()
        .format("%Y-%m-%d %H:%M:%SZ")
        .to_string()
}

/// The page's own fetch of POST `path` with its CSRF token: the statuses.
async fn posts(chrome: &Chrome, calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls.iter().map(|(p, b)| json!([p, b])).collect();
    chrome
        .client
        .execute(
            "const [calls] = arguments;
             return fetch('/api/session').then(r => r.json()).then(s => Promise.all(calls.map(
                 ([path, body]) => fetch(path, { method: 'POST',
                     headers: {'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf},
                     body: JSON.stringify(body) }).then(r => r.status))));",
            vec![json!(calls)],
        )
        .await
        .unwrap()
}

/// Waits until nothing matches `css`.
async fn wait_gone(chrome: &Chrome, css: &str) {
    let started = Instant::now();
    while chrome.client.find(Locator::Css(css)).await.is_ok() {
        assert!(started.elapsed() < S10, "{css} gone within 10s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the flash message contains `want` (an earlier action's
/// message may still be on show, and is replaced under the finder's feet);
/// returns it.
async fn wait_flash(chrome: &Chrome, want: &str) -> String {
    let started = Instant::now();
    loop {
        let got = chrome.text("#flash-msg").await;
        if let Some(text) = got.as_deref()
            && text.contains(want)
        {
            return text.to_owned();
        }
        assert!(
            started.elapsed() < S10,
            "the flash says {want:?} within 10s (last: {got:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_page_lists_them_and_only_admins_change_them() {
    let db = TestDb::new().await;
    let (_scratch, file) = schedules_auth_file();
    let broker = console(&db).auth_file(&file).start().await;
    let base = format!("http://{}/", broker.http());
    let mut admin = admin_client(&broker).await;
    let nightly = pb::Schedule {
        name: "nightly-report".into(),
        cron: "0 30 2 * * *".into(),
        time_zone: "Europe/Paris".into(),
        job: Some(pb::JobTemplate {
            queue: "reports".into(),
            payload: b"build the report".to_vec(),
            ..Default::default()
        }),
        overlap: pb::OverlapPolicy::Skip as i32,
        catch_up: pb::CatchUpPolicy::All as i32,
        catch_up_limit: 5,
        paused: false,
    };
    let heartbeat = pb::Schedule {
        name: "heartbeat".into(),
        cron: "* * * * * *".into(),
        time_zone: String::new(),
        job: Some(pb::JobTemplate {
            queue: "pings".into(),
            payload: b"ping".to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    for s in [nightly, heartbeat] {
        admin
            .create_schedule(pb::CreateScheduleRequest { schedule: Some(s) })
            .await
            .expect("create schedule");
    }
    eventually(S10, "a heartbeat tick", || {
        let mut admin = admin.clone();
        async move {
            !get_schedule(&mut admin, "heartbeat")
                .await
                .unwrap()
                .last_job_id
                .is_empty()
        }
    })
    .await;

    // --- an admin everywhere: every schedule, with its actions.
    let chrome = Chrome::start(false).await;
    chrome.login(&base, ADMIN).await;
    chrome.click("#nav a[data-nav='schedules']").await;
    let row = "tr[data-schedule='nightly-report']";
    chrome.wait_for(row).await;
    chrome
        .wait_text(&format!("{row} td[data-col='cron']"), "0 30 2 * * *")
        .await;
    chrome
        .wait_text(&format!("{row} td[data-col='zone']"), "Europe/Paris")
        .await;
    chrome
        .wait_text(&format!("{row} td[data-col='queue']"), "reports")
        .await;
    chrome
        .wait_text(
            &format!("{row} td[data-col='policies']"),
            "overlap skip, catch-up all (latest 5)",
        )
        .await;
    chrome
        .wait_text(&format!("{row} td[data-col='paused']"), "no")
        .await;
    chrome
        .wait_text(&format!("{row} td[data-col='last']"), "–")
        .await;
    let info = get_schedule(&mut admin, "nightly-report").await.unwrap();
    chrome
        .wait_text(
            &format!("{row} td[data-col='next']"),
            &shown(&info.next_run_at),
        )
        .await;
    let hb = "tr[data-schedule='heartbeat']";
    chrome
        .wait_text(
            &format!("{hb} td[data-col='policies']"),
            "overlap allow, catch-up one",
        )
        .await;
    chrome
        .wait_text(&format!("{hb} td[data-col='zone']"), "UTC")
        .await;
    let last = chrome
        .text(&format!("{hb} td[data-col='last'] a"))
        .await
        .expect("the heartbeat's last tick links its job");
    assert!(last.ends_with('Z'), "{last}");
    chrome.wait_for("#schedule-actions").await;
    chrome.screenshot("schedules").await;

    // Pause, then resume, the heartbeat.
    chrome.click(&format!("{hb} .pause-schedule")).await;
    wait_flash(&chrome, "heartbeat: paused").await;
    chrome
        .wait_text(&format!("{hb} td[data-col='paused']"), "paused")
        .await;
    chrome
        .wait_text(&format!("{hb} td[data-col='next']"), "–")
        .await;
    assert!(
        get_schedule(&mut admin, "heartbeat")
            .await
            .unwrap()
            .schedule
            .unwrap()
            .paused
    );
    chrome.click(&format!("{hb} .resume-schedule")).await;
    chrome
        .wait_text(&format!("{hb} td[data-col='paused']"), "no")
        .await;
    assert!(
        !get_schedule(&mut admin, "heartbeat")
            .await
            .unwrap()
            .schedule
            .unwrap()
            .paused
    );

    // Run now: the nightly report's job, enqueued at once.
    chrome.click(&format!("{row} .run-schedule")).await;
    let flash = wait_flash(&chrome, "enqueued").await;
    let id: String = sqlx::query_scalar("select id::text from leaseq.jobs where queue = 'reports'")
        .fetch_one(&db.pool)
        .await
        .expect("the run's job");
    assert!(flash.contains(&format!("job {id} enqueued")), "{flash}");
    let info = get_schedule(&mut admin, "nightly-report").await.unwrap();
    assert_eq!(info.last_job_id, id);

    // Delete: refused unless confirmed with the name, then done. A name
    // that is none (a space, 129 characters) is refused as such.
    let long = format!("/api/schedules/{}/pause", "n".repeat(129));
    let statuses = posts(
        &chrome,
        &[
            (
                "/api/schedules/heartbeat/delete",
                json!({"confirm": "heart"}),
            ),
            ("/api/schedules/heartbeat/delete", json!([])),
            ("/api/schedules/bad%20name/pause", json!({})),
            (&long, json!({})),
        ],
    )
    .await;
    assert_eq!(statuses, json!([400, 400, 400, 400]));
    chrome.click(&format!("{hb} .delete-schedule")).await;
    let confirm = chrome.wait_for("#confirm-delete-schedule").await;
    assert!(
        !confirm.is_enabled().await.unwrap(),
        "confirm needs the name"
    );
    chrome
        .wait_for("#delete-schedule-name")
        .await
        .send_keys("heartbeat")
        .await
        .unwrap();
    chrome.click("#confirm-delete-schedule").await;
    wait_gone(&chrome, hb).await;
    wait_flash(&chrome, "heartbeat deleted").await;
    let gone = get_schedule(&mut admin, "heartbeat").await.unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    chrome.close().await;

    // Another schedule on a queue only ops may change.
    admin
        .create_schedule(pb::CreateScheduleRequest {
            schedule: Some(pb::Schedule {
                name: "cleanup".into(),
                cron: "0 0 * * *".into(),
                job: Some(pb::JobTemplate {
                    queue: "maintenance".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("create schedule");

    // --- read-only: the schedules, no action; the server refuses them.
    let chrome = Chrome::start(false).await;
    chrome.login(&base, VIEWER).await;
    chrome
        .client
        .goto(&format!("{base}#/schedules"))
        .await
        .unwrap();
    chrome.wait_for(row).await;
    chrome.wait_for("tr[data-schedule='cleanup']").await;
    for css in [
        "#schedule-actions",
        ".pause-schedule",
        ".resume-schedule",
        ".run-schedule",
        ".delete-schedule",
    ] {
        assert!(
            chrome.client.find(Locator::Css(css)).await.is_err(),
            "a read-only session sees {css}"
        );
    }
    chrome.screenshot("schedules-read-only").await;
    let n = "/api/schedules/nightly-report";
    let statuses = posts(
        &chrome,
        &[
            (&format!("{n}/pause"), json!({})),
            (&format!("{n}/resume"), json!({})),
            (&format!("{n}/run"), json!({})),
            (&format!("{n}/delete"), json!({"confirm": "nightly-report"})),
            ("/api/schedules/no-such/pause", json!({})),
        ],
    )
    .await;
    assert_eq!(statuses, json!([403, 403, 403, 403, 404]));
    chrome.close().await;

    // --- admin on `reports` only: its schedule with actions, not the others.
    let chrome = Chrome::start(false).await;
    chrome.login(&base, REPORTS).await;
    chrome
        .client
        .goto(&format!("{base}#/schedules"))
        .await
        .unwrap();
    chrome.wait_for(&format!("{row} .pause-schedule")).await;
    assert!(
        chrome
            .client
            .find(Locator::Css("tr[data-schedule='cleanup']"))
            .await
            .is_err(),
        "a schedule of a queue the token cannot read is listed"
    );
    let statuses = posts(
        &chrome,
        &[
            ("/api/schedules/cleanup/pause", json!({})),
            ("/api/schedules/cleanup/run", json!({})),
        ],
    )
    .await;
    assert_eq!(statuses, json!([404, 404]), "cleanup is not theirs to see");
    chrome.close().await;

    // Nothing the refused calls asked for happened.
    let info = get_schedule(&mut admin, "nightly-report").await.unwrap();
    assert!(!info.schedule.unwrap().paused);
    assert_eq!(info.last_job_id, id, "no second run");
    let cleanup = get_schedule(&mut admin, "cleanup").await.unwrap();
    assert!(!cleanup.schedule.unwrap().paused && cleanup.last_job_id.is_empty());
    assert_eq!(
        db.count("select count(*) from leaseq.jobs where queue in ('reports', 'maintenance')")
            .await,
        1
    );
    broker.stop().await;
}
