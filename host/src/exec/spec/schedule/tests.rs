//! The schedule's unit tests: periods, DST gaps and folds, and accounting from a cursor.
use super::*;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

#[test]
fn a_daily_schedule_has_date_periods() {
    let s = Schedule::parse("0 30 2 * * *", "Europe/London").unwrap();
    let p = s.current(utc("2026-11-29T11:57:00Z")).unwrap();
    assert_eq!(p.id, "2026-11-29");
    assert_eq!(p.fire.to_rfc3339(), "2026-11-29T02:30:00+00:00");
    let before = s.current(utc("2026-11-29T02:29:59Z")).unwrap();
    assert_eq!(before.id, "2026-11-28");
    assert_eq!(
        s.next(utc("2026-11-29T11:57:00Z")).unwrap().id,
        "2026-11-30"
    );
}

#[test]
fn the_next_period_starts_after_now() {
    let s = Schedule::parse("* * * * * *", "UTC").unwrap();
    let now = utc("2026-11-29T14:31:49.300Z");
    assert_eq!(s.current(now).unwrap().id, "2026-11-29T14:31:49");
    assert_eq!(s.next(now).unwrap().id, "2026-11-29T14:31:50");
}

#[test]
fn a_fire_time_is_its_own_current_period() {
    let s = Schedule::parse("0 30 2 * * *", "UTC").unwrap();
    assert_eq!(
        s.current(utc("2026-11-29T02:30:00Z")).unwrap().id,
        "2026-11-29"
    );
}

#[test]
fn an_hourly_schedule_has_date_time_periods() {
    let s = Schedule::parse("0 0 * * * *", "America/New_York").unwrap();
    let p = s.current(utc("2026-11-29T15:20:00Z")).unwrap();
    assert_eq!(p.id, "2026-11-29T10:00:00");
}

#[test]
fn periods_are_found_by_id() {
    let s = Schedule::parse("0 30 2 * * *", "Asia/Tokyo").unwrap();
    let p = s.period_by_id("2026-11-27").unwrap();
    assert_eq!(p.fire.to_rfc3339(), "2026-11-27T02:30:00+09:00");
    assert!(s.period_by_id("2026-11-31").is_none());
    assert!(s.period_by_id("yesterday").is_none());
    let h = Schedule::parse("0 0 */6 * * *", "UTC").unwrap();
    assert!(h.period_by_id("2026-11-27T06:00:00").is_some());
    assert!(h.period_by_id("2026-11-27T07:00:00").is_none());
}

/// Every period of `s` from `from` to `to` (RFC 3339), oldest first.
fn periods(s: &Schedule, from: &str, to: &str) -> Vec<Period> {
    let start = s.current(utc(from)).unwrap();
    s.since(Some(start.fire.with_timezone(&Utc)), utc(to), 10_000)
        .0
}

#[test]
fn a_daily_fire_in_a_dst_gap_fires_once_after_the_gap() {
    // Europe/Berlin springs forward on 2026-03-29 from 02:00 to 03:00: 02:30 does not exist.
    let s = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
    let got: Vec<(String, String)> = periods(&s, "2026-03-27T12:00:00Z", "2026-03-31T12:00:00Z")
        .into_iter()
        .map(|p| (p.id, p.fire.to_rfc3339()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("2026-03-28".into(), "2026-03-28T02:30:00+01:00".into()),
            ("2026-03-29".into(), "2026-03-29T03:30:00+02:00".into()),
            ("2026-03-30".into(), "2026-03-30T02:30:00+02:00".into()),
            ("2026-03-31".into(), "2026-03-31T02:30:00+02:00".into()),
        ]
    );
    // Between 03:00 and 03:30 local on the day of the gap, the day's period has not begun.
    assert_eq!(
        s.current(utc("2026-03-29T01:10:00Z")).unwrap().id,
        "2026-03-28"
    );
    assert_eq!(
        s.next(utc("2026-03-29T01:10:00Z"))
            .unwrap()
            .fire
            .to_rfc3339(),
        "2026-03-29T03:30:00+02:00"
    );
    assert_eq!(
        s.current(utc("2026-03-29T01:30:00Z")).unwrap().id,
        "2026-03-29"
    );
}

#[test]
fn a_daily_fire_in_a_dst_fold_fires_once_at_its_first_occurrence() {
    // Europe/Berlin falls back on 2026-10-25 from 03:00 to 02:00: 02:30 happens twice.
    let s = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
    let got: Vec<(String, String)> = periods(&s, "2026-10-23T12:00:00Z", "2026-10-27T12:00:00Z")
        .into_iter()
        .map(|p| (p.id, p.fire.to_rfc3339()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("2026-10-24".into(), "2026-10-24T02:30:00+02:00".into()),
            ("2026-10-25".into(), "2026-10-25T02:30:00+02:00".into()),
            ("2026-10-26".into(), "2026-10-26T02:30:00+01:00".into()),
            ("2026-10-27".into(), "2026-10-27T02:30:00+01:00".into()),
        ]
    );
    // At the second 02:30 (01:30 UTC) nothing new has started: the cursor is at today's.
    let first = s.period_by_id("2026-10-25").unwrap();
    let first = first.fire.with_timezone(&Utc);
    let (again, _) = s.since(Some(first), utc("2026-10-25T01:45:00Z"), 10);
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn an_hourly_schedule_runs_the_repeated_hour_once() {
    let s = Schedule::parse("0 30 * * * *", "Europe/Berlin").unwrap();
    let ids: Vec<String> = periods(&s, "2026-10-24T22:00:00Z", "2026-10-25T03:00:00Z")
        .into_iter()
        .map(|p| p.id)
        .collect();
    // Local 01:30 (CEST), 02:30 (CEST; the CET repeat is the same wall time), 03:30 (CET).
    assert_eq!(
        ids,
        vec![
            "2026-10-25T00:30:00",
            "2026-10-25T01:30:00",
            "2026-10-25T02:30:00",
            "2026-10-25T03:30:00"
        ]
    );
}

#[test]
fn periods_since_a_cursor_are_capped_to_the_newest() {
    let s = Schedule::parse("0 0 * * * *", "UTC").unwrap();
    let cursor = s
        .period_by_id("2026-11-29T00:00:00")
        .unwrap()
        .fire
        .with_timezone(&Utc);
    let (ps, truncated) = s.since(Some(cursor), utc("2026-11-29T10:30:00Z"), 3);
    assert!(truncated);
    let ids: Vec<&str> = ps.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "2026-11-29T08:00:00",
            "2026-11-29T09:00:00",
            "2026-11-29T10:00:00"
        ]
    );
    let (all, truncated) = s.since(Some(cursor), utc("2026-11-29T10:30:00Z"), 100);
    assert!(!truncated);
    assert_eq!(all.len(), 10);
}

/// Every wall-clock fire time of `s` on the local days `from..=to` (dates), as period ids:
/// the periods that exist, found without the cursor logic.
fn existing(s: &Schedule, from: &str, to: &str) -> Vec<String> {
    let day = |d: &str| NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
    let start = as_utc(day(from).and_hms_opt(0, 0, 0).unwrap() - chrono::Duration::seconds(1));
    let end = day(to).and_hms_opt(23, 59, 59).unwrap();
    s.cron
        .after(&start)
        .map(|f| f.naive_utc())
        .take_while(|l| *l <= end)
        .map(|l| s.period(l).id)
        .collect()
}

#[test]
fn every_fire_time_is_accounted_once_across_both_dst_changes() {
    // Zones with a spring and an autumn change in 2026 (Sydney's run the other way round,
    // Lord Howe's are 30 minutes), and one without; schedules from every 15 minutes to
    // weekly. A leader accounts from the cursor at irregular moments (every 7 to 47
    // minutes, sometimes after a 9-hour outage); every period that exists in the window
    // must be accounted exactly once.
    let zones = [
        "Europe/Berlin",
        "America/New_York",
        "Australia/Sydney",
        "Australia/Lord_Howe",
        "Asia/Tokyo",
    ];
    let schedules = [
        "0 0 * * * *",
        "0 */15 * * * *",
        "0 30 2 * * *",
        "0 30 2 * * Sun",
    ];
    // Local-day windows around both 2026 changes of these zones (with margin).
    let windows = [("2026-03-06", "2026-04-10"), ("2026-09-30", "2026-11-05")];
    for zone in zones {
        for expr in schedules {
            let s = Schedule::parse(expr, zone).unwrap();
            for (from, to) in windows {
                let want = existing(&s, from, to);
                let first = s.period_by_id(&want[0]).unwrap().fire.with_timezone(&Utc);
                let last = s
                    .period_by_id(want.last().unwrap())
                    .unwrap()
                    .fire
                    .with_timezone(&Utc);
                // The cursor starts just before the first period; the leader stops once
                // the last one has fired.
                let mut cursor = first - chrono::Duration::seconds(1);
                let mut now = cursor;
                let mut got = Vec::new();
                let mut step = 0u64;
                while now < last {
                    step += 1;
                    let minutes = if step.is_multiple_of(97) {
                        9 * 60
                    } else {
                        7 + (step * 13) % 41
                    };
                    now = (now + chrono::Duration::minutes(minutes as i64)).min(last);
                    let (fired, truncated) = s.since(Some(cursor), now, 100_000);
                    assert!(!truncated);
                    if let Some(newest) = fired.iter().map(|p| p.fire).max() {
                        cursor = newest.with_timezone(&Utc);
                    }
                    got.extend(fired.into_iter().map(|p| p.id));
                }
                let mut unique = got.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(
                    unique.len(),
                    got.len(),
                    "{expr} in {zone}: a period accounted twice"
                );
                let mut want_sorted = want.clone();
                want_sorted.sort();
                assert_eq!(
                    unique, want_sorted,
                    "{expr} in {zone}, {from}..{to}: accounted periods differ from those that exist"
                );
            }
        }
    }
}

#[test]
fn fire_times_in_a_gap_of_a_quarter_hourly_schedule_are_accounted() {
    // The reported case: Europe/Berlin, 2026-03-29, 02:15, 02:30 and 02:45 do not exist on
    // the wall clock; they fire at 03:15, 03:30 and 03:45 CEST (01:15–01:45 UTC), after
    // 03:00 (01:00 UTC). A leader that accounted 03:00 must still account them.
    let s = Schedule::parse("0 */15 * * * *", "Europe/Berlin").unwrap();
    let (first, _) = s.since(
        Some(utc("2026-03-29T00:50:00Z")),
        utc("2026-03-29T01:05:00Z"),
        100,
    );
    let ids: Vec<&str> = first.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, vec!["2026-03-29T02:00:00", "2026-03-29T03:00:00"]);
    let cursor = first.last().unwrap().fire.with_timezone(&Utc);
    let (next, _) = s.since(Some(cursor), utc("2026-03-29T01:50:00Z"), 100);
    let ids: Vec<&str> = next.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "2026-03-29T02:15:00",
            "2026-03-29T03:15:00",
            "2026-03-29T02:30:00",
            "2026-03-29T03:30:00",
            "2026-03-29T02:45:00",
            "2026-03-29T03:45:00"
        ]
    );
}
