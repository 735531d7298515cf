//! Schedules (cron): a cron expression read in a time zone enqueues a job
//! made from a template at each tick (docs/design/schedules.md).
//!
//! - this file: the validated definition ([`Definition`]), the cron and its
//!   zone ([`Spec`], on croner and chrono-tz), and which ticks are due
//!   ([`due`]), all without I/O;
//! - `store.rs`: the SQL of the two tables (`leaseq.schedules` on the home
//!   cluster, `leaseq.schedule_ticks` beside each tick's job);
//! - `run.rs`: every broker's schedule loop, and the firing of one tick
//!   (also for RunSchedule).
//!
//! Exactly one job per tick is kept by the database: a loop takes due
//! schedules `for update skip locked`, so one broker at a time fires a
//! schedule, and the tick's row in `schedule_ticks` (primary key schedule and
//! tick) is inserted with its job, so a tick fired twice (two commits over
//! two clusters, one of them lost) enqueues once.

pub(crate) mod run;
pub(crate) mod store;

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::config::RequestLimits;
use crate::domain::{MAX_HEADERS, NewJob, QueueName};
use crate::error::{Error, Result};
use crate::pb;

/// Longest cron expression, in bytes.
pub const MAX_CRON_LEN: usize = 256;
/// Longest time zone name, in bytes (the longest IANA name is 32).
pub const MAX_ZONE_LEN: usize = 64;
/// Most schedules a deployment holds.
pub const MAX_SCHEDULES: i64 = 10_000;
/// Bound of `catch_up_limit`, and its default.
pub const MAX_CATCH_UP: u32 = 1000;
pub const DEFAULT_CATCH_UP: u32 = 10;
/// Most ticks within the grace one pass fires for a schedule (a cron every
/// second with a grace of an hour has 3,600); the rest are counted missed.
pub const MAX_ON_TIME: usize = 1000;
/// The headers every tick's job gets: the schedule's name and the tick's
/// time (RFC 3339, UTC, milliseconds). Template keys may not start with
/// [`RESERVED_PREFIX`].
pub const HEADER_SCHEDULE: &str = "leaseq-schedule";
pub const HEADER_TICK: &str = "leaseq-schedule-tick";
pub const RESERVED_PREFIX: &str = "leaseq-schedule";

/// A cron expression and the zone it is read in.
#[derive(Clone, Debug)]
pub struct Spec {
    cron: Cron,
    zone: Tz,
}

impl Spec {
    /// Five fields, or six with seconds first (croner's `Seconds::Optional`;
    /// years are refused, so six fields always mean seconds). The zone is an
    /// IANA name; empty is UTC.
    pub fn parse(cron: &str, zone: &str) -> Result<Spec> {
        if cron.len() > MAX_CRON_LEN {
            return Err(Error::invalid(
                "cron",
                format!("must be at most {MAX_CRON_LEN} bytes"),
            ));
        }
        if cron.trim().is_empty() {
            return Err(Error::invalid("cron", "must not be empty"));
        }
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| {
                Error::invalid("cron", format!("{cron:?} is not a cron expression: {e}"))
            })?;
        let zone = parse_zone(zone)?;
        Ok(Spec { cron: parsed, zone })
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The first tick at or after `t`.
    fn at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Ticks fall on whole seconds: the first candidate is `t` rounded up.
        let whole = ceil_second(t);
        let local = whole.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The last tick strictly before `t`. Ticks fall on whole seconds: the
    /// search starts from `t` rounded down, which is itself a candidate when
    /// `t` had a fraction (croner compares whole seconds).
    fn before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let floor = floor_second(t);
        let local = floor.with_timezone(&self.zone);
        self.cron
            .find_previous_occurrence(&local, floor < t)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    pub fn zone_name(&self) -> &'static str {
        self.zone.name()
    }
}

fn parse_zone(zone: &str) -> Result<Tz> {
    if zone.is_empty() {
        return Ok(Tz::UTC);
    }
    if zone.len() > MAX_ZONE_LEN {
        return Err(Error::invalid(
            "time_zone",
            format!("must be at most {MAX_ZONE_LEN} bytes"),
        ));
    }
    Tz::from_str(zone).map_err(|_| {
        Error::invalid(
            "time_zone",
            format!("{zone:?} is not an IANA time zone name (such as Europe/Paris or UTC)"),
        )
    })
}

fn floor_second(t: DateTime<Utc>) -> DateTime<Utc> {
    Utc.timestamp_opt(t.timestamp(), 0).single().unwrap_or(t)
}

fn ceil_second(t: DateTime<Utc>) -> DateTime<Utc> {
    let floor = floor_second(t);
    if floor == t {
        t
    } else {
        floor + chrono::Duration::seconds(1)
    }
}

/// What a tick does while the previous run's job is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    Allow,
    Skip,
}

/// Which missed ticks (later than the grace) fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    None,
    One,
    All,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
        }
    }

    pub fn from_db(s: &str) -> Overlap {
        if s == "skip" {
            Overlap::Skip
        } else {
            Overlap::Allow
        }
    }

    fn from_pb(v: i32, field: &str) -> Result<Option<Overlap>> {
        match pb::OverlapPolicy::try_from(v) {
            Ok(pb::OverlapPolicy::Unspecified) => Ok(None),
            Ok(pb::OverlapPolicy::Allow) => Ok(Some(Overlap::Allow)),
            Ok(pb::OverlapPolicy::Skip) => Ok(Some(Overlap::Skip)),
            Err(_) => Err(Error::invalid(field, format!("unknown policy {v}"))),
        }
    }

    pub fn to_pb(self) -> pb::OverlapPolicy {
        match self {
            Overlap::Allow => pb::OverlapPolicy::Allow,
            Overlap::Skip => pb::OverlapPolicy::Skip,
        }
    }
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::One => "one",
            CatchUp::All => "all",
        }
    }

    pub fn from_db(s: &str) -> CatchUp {
        match s {
            "none" => CatchUp::None,
            "all" => CatchUp::All,
            _ => CatchUp::One,
        }
    }

    fn from_pb(v: i32, field: &str) -> Result<Option<CatchUp>> {
        match pb::CatchUpPolicy::try_from(v) {
            Ok(pb::CatchUpPolicy::Unspecified) => Ok(None),
            Ok(pb::CatchUpPolicy::None) => Ok(Some(CatchUp::None)),
            Ok(pb::CatchUpPolicy::One) => Ok(Some(CatchUp::One)),
            Ok(pb::CatchUpPolicy::All) => Ok(Some(CatchUp::All)),
            Err(_) => Err(Error::invalid(field, format!("unknown policy {v}"))),
        }
    }

    pub fn to_pb(self) -> pb::CatchUpPolicy {
        match self {
            CatchUp::None => pb::CatchUpPolicy::None,
            CatchUp::One => pb::CatchUpPolicy::One,
            CatchUp::All => pb::CatchUpPolicy::All,
        }
    }
}

/// The job template, validated as an Enqueue of the same fields would be.
#[derive(Clone, Debug)]
pub struct Template {
    pub queue: QueueName,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    pub priority: i32,
    pub max_attempts: Option<i32>,
    pub ttl_ms: Option<i64>,
}

impl Template {
    /// Field names in errors are prefixed with `field` (`schedule.job`).
    pub fn parse(
        t: Option<pb::JobTemplate>,
        field: &str,
        limits: &RequestLimits,
    ) -> Result<Template> {
        let t = t.ok_or_else(|| Error::invalid(field, "is required"))?;
        if t.headers.len() > MAX_HEADERS - 2 {
            return Err(Error::invalid(
                format!("{field}.headers"),
                format!(
                    "at most {} entries (two are the schedule's own)",
                    MAX_HEADERS - 2
                ),
            ));
        }
        if let Some(k) = t.headers.keys().find(|k| k.starts_with(RESERVED_PREFIX)) {
            return Err(Error::invalid(
                format!("{field}.headers"),
                format!("key {k:?}: keys starting with {RESERVED_PREFIX:?} are the schedule's own"),
            ));
        }
        // The Enqueue rules, field for field.
        let job = NewJob::parse(
            pb::EnqueueRequest {
                queue: t.queue,
                payload: t.payload,
                headers: t.headers,
                priority: t.priority,
                max_attempts: t.max_attempts,
                ttl: t.ttl,
                ..Default::default()
            },
            limits,
        )
        .map_err(|e| e.in_field(field))?;
        Ok(Template {
            queue: job.queue,
            payload: job.payload,
            headers: job.headers,
            priority: job.priority,
            max_attempts: job.max_attempts,
            ttl_ms: job.ttl_ms,
        })
    }

    pub fn to_pb(&self) -> pb::JobTemplate {
        pb::JobTemplate {
            queue: self.queue.to_string(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            priority: self.priority,
            max_attempts: self.max_attempts.unwrap_or(0),
            ttl: self.ttl_ms.map(|ms| prost_types::Duration {
                seconds: ms / 1000,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            }),
        }
    }

    /// The job of the tick at `tick`.
    pub fn job(&self, schedule: &str, tick: DateTime<Utc>) -> NewJob {
        let mut headers = self.headers.clone();
        headers.insert(HEADER_SCHEDULE.to_owned(), schedule.to_owned());
        headers.insert(HEADER_TICK.to_owned(), tick_header(tick));
        let headers_json = serde_json::to_string(&headers).unwrap_or_else(|_| "{}".to_owned());
        NewJob {
            id: crate::domain::JobId::new(),
            queue: self.queue.clone(),
            payload: self.payload.clone(),
            headers,
            headers_json,
            priority: self.priority,
            schedule: crate::domain::Schedule::Now,
            dedup_key: None,
            max_attempts: self.max_attempts,
            ttl_ms: self.ttl_ms,
            key: None,
            unique_for_ms: None,
            replace: false,
        }
    }
}

/// A tick's time as its job's `leaseq-schedule-tick` header.
pub fn tick_header(tick: DateTime<Utc>) -> String {
    tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A schedule's name: the queue-name rule.
pub fn parse_name(s: &str, field: &str) -> Result<String> {
    QueueName::parse(s)
        .map(|q| q.to_string())
        .ok_or_else(|| Error::invalid(field, QueueName::RULE))
}

/// A validated `Schedule` message.
#[derive(Clone, Debug)]
pub struct Definition {
    pub name: String,
    pub cron: String,
    pub spec: Spec,
    pub template: Template,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub catch_up_limit: u32,
    pub paused: bool,
}

impl Definition {
    pub fn parse(s: Option<pb::Schedule>, limits: &RequestLimits) -> Result<Definition> {
        let s = s.ok_or_else(|| Error::invalid("schedule", "is required"))?;
        let name = parse_name(&s.name, "schedule.name")?;
        let spec = Spec::parse(&s.cron, &s.time_zone).map_err(|e| e.in_field("schedule"))?;
        let template = Template::parse(s.job, "schedule.job", limits)?;
        Ok(Definition {
            name,
            cron: s.cron.trim().to_owned(),
            spec,
            template,
            overlap: Overlap::from_pb(s.overlap, "schedule.overlap")?.unwrap_or(Overlap::Allow),
            catch_up: CatchUp::from_pb(s.catch_up, "schedule.catch_up")?.unwrap_or(CatchUp::One),
            catch_up_limit: catch_up_limit(s.catch_up_limit, "schedule.catch_up_limit")?,
            paused: s.paused,
        })
    }

    /// Applies an update; errors name the update's fields.
    pub fn update(&mut self, r: pb::UpdateScheduleRequest, limits: &RequestLimits) -> Result<bool> {
        let mut respec = false;
        if r.cron.is_some() || r.time_zone.is_some() {
            let cron = r.cron.clone().unwrap_or_else(|| self.cron.clone());
            let zone = r
                .time_zone
                .clone()
                .unwrap_or_else(|| self.spec.zone_name().to_owned());
            self.spec = Spec::parse(&cron, &zone)?;
            self.cron = cron.trim().to_owned();
            respec = true;
        }
        if r.job.is_some() {
            self.template = Template::parse(r.job, "job", limits)?;
        }
        if let Some(o) = Overlap::from_pb(r.overlap, "overlap")? {
            self.overlap = o;
        }
        if let Some(c) = CatchUp::from_pb(r.catch_up, "catch_up")? {
            self.catch_up = c;
        }
        if let Some(n) = r.catch_up_limit {
            self.catch_up_limit = catch_up_limit(n, "catch_up_limit")?;
        }
        if let Some(p) = r.paused {
            self.paused = p;
        }
        Ok(respec)
    }

    pub fn to_pb(&self) -> pb::Schedule {
        pb::Schedule {
            name: self.name.clone(),
            cron: self.cron.clone(),
            time_zone: self.spec.zone_name().to_owned(),
            job: Some(self.template.to_pb()),
            overlap: self.overlap.to_pb() as i32,
            catch_up: self.catch_up.to_pb() as i32,
            catch_up_limit: self.catch_up_limit,
            paused: self.paused,
        }
    }
}

fn catch_up_limit(n: u32, field: &str) -> Result<u32> {
    match n {
        0 => Ok(DEFAULT_CATCH_UP),
        n if n <= MAX_CATCH_UP => Ok(n),
        _ => Err(Error::invalid(
            field,
            format!("must be 0 (= {DEFAULT_CATCH_UP}) or 1 to {MAX_CATCH_UP}"),
        )),
    }
}

/// The ticks a pass fires for a schedule whose next tick is `next`, at
/// `now`, and where the schedule goes next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// In time order: the missed ticks the catch-up policy keeps, then
    /// every tick within the grace (at most [`MAX_ON_TIME`]).
    pub fire: Vec<DateTime<Utc>>,
    /// The first tick after `now`: the schedule's next `next_run_at`.
    pub next: Option<DateTime<Utc>>,
}

/// Ticks at or after `now - grace` are on time and all fire; earlier ones
/// (from `next` on) were missed, and fire as `catch_up` says (the latest
/// one, or the latest `limit`). The search is bounded by what fires, not by
/// how long the schedule was left: missed ticks are counted back from the
/// grace's start.
pub fn due(
    spec: &Spec,
    next: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: Duration,
    catch_up: CatchUp,
    limit: u32,
) -> Due {
    let cutoff = now - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::zero());
    let mut fire = Vec::new();
    if next < cutoff {
        let keep = match catch_up {
            CatchUp::None => 0,
            CatchUp::One => 1,
            CatchUp::All => limit as usize,
        };
        let mut t = cutoff;
        while fire.len() < keep {
            match spec.before(t) {
                Some(p) if p >= next => {
                    fire.push(p);
                    t = p;
                }
                _ => break,
            }
        }
        fire.reverse();
    }
    let mut t = spec.at_or_after(next.max(cutoff));
    let mut on_time = 0;
    while let Some(tick) = t {
        if tick > now || on_time == MAX_ON_TIME {
            break;
        }
        fire.push(tick);
        on_time += 1;
        t = spec.next_after(tick);
    }
    Due {
        fire,
        next: spec.next_after(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_and_six_fields_are_cron_and_years_are_refused() {
        let five = Spec::parse("*/15 * * * *", "").unwrap();
        assert_eq!(
            five.next_after(utc("2026-01-01T00:00:00Z")),
            Some(utc("2026-01-01T00:15:00Z"))
        );
        let six = Spec::parse("*/2 * * * * *", "UTC").unwrap();
        assert_eq!(
            six.next_after(utc("2026-01-01T00:00:00.500Z")),
            Some(utc("2026-01-01T00:00:02Z"))
        );
        let seven = Spec::parse("0 0 0 1 1 * 2030", "UTC").unwrap_err();
        assert!(seven.to_string().starts_with("cron: "), "{seven}");
        for bad in ["", "61 * * * *", "* * *", "every minute"] {
            let e = Spec::parse(bad, "UTC").unwrap_err();
            assert!(e.to_string().starts_with("cron: "), "{bad}: {e}");
        }
        let e = Spec::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(e.to_string().starts_with("time_zone: "), "{e}");
    }

    #[test]
    fn a_zone_moves_the_tick_and_daylight_saving_is_followed() {
        // 09:00 in New York is 14:00 UTC in winter (EST) and 13:00 in
        // summer (EDT); the clocks go forward on 2026-03-08.
        let spec = Spec::parse("0 9 * * *", "America/New_York").unwrap();
        assert_eq!(
            spec.next_after(utc("2026-03-07T15:00:00Z")),
            Some(utc("2026-03-08T13:00:00Z"))
        );
        assert_eq!(
            spec.next_after(utc("2026-03-06T15:00:00Z")),
            Some(utc("2026-03-07T14:00:00Z"))
        );
        // 02:30 does not exist on 2026-03-08 (02:00 -> 03:00 EDT): croner
        // fires at the end of the gap, 03:00 EDT = 07:00 UTC, once.
        let gap = Spec::parse("30 2 * * *", "America/New_York").unwrap();
        assert_eq!(
            gap.next_after(utc("2026-03-08T05:00:00Z")),
            Some(utc("2026-03-08T07:00:00Z"))
        );
        assert_eq!(
            gap.next_after(utc("2026-03-08T07:00:00Z")),
            Some(utc("2026-03-09T06:30:00Z"))
        );
        // 01:30 happens twice on 2026-11-01 (EDT then EST): once, the first.
        let twice = Spec::parse("30 1 * * *", "America/New_York").unwrap();
        assert_eq!(
            twice.next_after(utc("2026-11-01T04:00:00Z")),
            Some(utc("2026-11-01T05:30:00Z"))
        );
        assert_eq!(
            twice.next_after(utc("2026-11-01T05:30:00Z")),
            Some(utc("2026-11-02T06:30:00Z"))
        );
    }

    #[test]
    fn due_fires_on_time_ticks_and_the_catch_up_of_missed_ones() {
        let spec = Spec::parse("* * * * * *", "UTC").unwrap();
        let grace = Duration::from_secs(2);
        let now = utc("2026-01-01T00:01:00.300Z");
        // On time: next within the grace; every tick up to now fires.
        let d = due(
            &spec,
            utc("2026-01-01T00:00:59Z"),
            now,
            grace,
            CatchUp::None,
            10,
        );
        assert_eq!(
            d.fire,
            vec![utc("2026-01-01T00:00:59Z"), utc("2026-01-01T00:01:00Z")]
        );
        assert_eq!(d.next, Some(utc("2026-01-01T00:01:01Z")));
        // A minute down: none, one, all up to 3.
        let next = utc("2026-01-01T00:00:00Z");
        let on_time = vec![utc("2026-01-01T00:00:59Z"), utc("2026-01-01T00:01:00Z")];
        assert_eq!(due(&spec, next, now, grace, CatchUp::None, 3).fire, on_time);
        let one = due(&spec, next, now, grace, CatchUp::One, 3).fire;
        assert_eq!(one[0], utc("2026-01-01T00:00:58Z"));
        assert_eq!(one[1..], on_time[..]);
        let all = due(&spec, next, now, grace, CatchUp::All, 3).fire;
        assert_eq!(
            all[..3],
            [
                utc("2026-01-01T00:00:56Z"),
                utc("2026-01-01T00:00:57Z"),
                utc("2026-01-01T00:00:58Z")
            ]
        );
        assert_eq!(all[3..], on_time[..]);
        // All, with fewer missed ticks than the limit: every one of them.
        let hourly = Spec::parse("0 * * * *", "UTC").unwrap();
        let d = due(
            &hourly,
            utc("2026-01-01T01:00:00Z"),
            utc("2026-01-01T03:30:00Z"),
            grace,
            CatchUp::All,
            10,
        );
        assert_eq!(
            d.fire,
            vec![
                utc("2026-01-01T01:00:00Z"),
                utc("2026-01-01T02:00:00Z"),
                utc("2026-01-01T03:00:00Z")
            ]
        );
        // Whatever the fraction of the grace's start, the latest missed
        // tick is the second before the first on-time one.
        for ms in ["000", "001", "500", "999"] {
            let now = utc(&format!("2026-01-01T00:01:00.{ms}Z"));
            let d = due(&spec, next, now, grace, CatchUp::One, 3);
            let on_time = d.fire[1];
            assert_eq!(
                (on_time - d.fire[0]).num_milliseconds(),
                1000,
                "{ms}: {:?}",
                d.fire
            );
        }
        // Not due yet: nothing.
        let d = due(
            &hourly,
            utc("2026-01-01T04:00:00Z"),
            utc("2026-01-01T03:30:00Z"),
            grace,
            CatchUp::All,
            10,
        );
        assert!(d.fire.is_empty());
    }
}
