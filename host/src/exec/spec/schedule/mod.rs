//! A job's schedule: a cron expression read on a time zone's wall clock ([`Schedule`]), and the
//! periods it fires ([`Period`]), including how fire times in DST gaps and folds map to instants.

use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use super::{SpecError, SpecField};

/// A cron schedule in a time zone, read on the zone's wall clock.
///
/// Fire times are the wall-clock times the cron expression names, each mapped to one instant:
/// a time that occurs twice (a DST fold) fires once, at its first occurrence; a time that does
/// not occur (a DST gap) fires at the instant it would have had under the offset in force before
/// the gap (02:30 in a gap of 02:00–03:00 fires at 03:30). So a daily job fires exactly once per
/// local day, whatever the transitions.
#[derive(Clone, Debug)]
pub struct Schedule {
    expr: String,
    cron: cron::Schedule,
    tz: Tz,
    /// Fires at most once per local day: period ids are dates.
    daily: bool,
}

/// One period: its id and its fire time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    /// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS`, local to the schedule's zone.
    pub id: String,
    /// The instant the period starts.
    pub fire: DateTime<Tz>,
    /// The wall-clock fire time the cron expression names.
    pub local: NaiveDateTime,
}

/// More than any zone's UTC offset changes at once (2 h in Antarctica/Troll, 1 h elsewhere):
/// how far a fire time's wall-clock reading and its instant can disagree in order.
const DST_REACH: chrono::Duration = chrono::Duration::hours(3);

/// Wall-clock times stand in for UTC inside the cron iterator: the zone is applied afterwards.
fn as_utc(local: NaiveDateTime) -> DateTime<Utc> {
    Utc.from_utc_datetime(&local)
}

impl Schedule {
    /// Parses a cron expression with seconds (`sec min hour dom month dow [year]`) in an IANA
    /// time zone.
    pub fn parse(expr: &str, time_zone: &str) -> Result<Self, SpecError> {
        let cron = cron::Schedule::from_str(expr).map_err(|e| {
            SpecError::field(
                SpecField::Schedule,
                format!("schedule {expr:?} is not a valid cron expression with seconds (sec min hour day-of-month month day-of-week): {e}"),
            )
        })?;
        let tz = Tz::from_str(time_zone).map_err(|_| {
            SpecError::field(
                SpecField::TimeZone,
                format!(
                    "time-zone {time_zone:?} is not an IANA time zone name (e.g. Europe/London, UTC)"
                ),
            )
        })?;
        let start = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap().into();
        let fires: Vec<_> = cron.after(&as_utc(start)).take(64).collect();
        if fires.is_empty() {
            return Err(SpecError::field(
                SpecField::Schedule,
                format!("schedule {expr:?} never fires"),
            ));
        }
        let daily = fires
            .windows(2)
            .all(|w| w[0].date_naive() != w[1].date_naive());
        Ok(Schedule {
            expr: expr.to_string(),
            cron,
            tz,
            daily,
        })
    }

    /// The cron expression.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// Whether periods are local days.
    pub fn is_daily(&self) -> bool {
        self.daily
    }

    /// The instant at which the wall-clock time `local` fires (see [`Schedule`]).
    pub fn instant(&self, local: NaiveDateTime) -> DateTime<Tz> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => t,
            LocalResult::Ambiguous(first, _) => first,
            LocalResult::None => {
                // In a gap: read `local` with the offset in force before the gap.
                let before = (1..=48)
                    .find_map(|h| {
                        self.tz
                            .from_local_datetime(&(local - chrono::Duration::hours(h)))
                            .earliest()
                    })
                    .map(|t| t.offset().fix().local_minus_utc())
                    .unwrap_or(0);
                self.tz
                    .from_utc_datetime(&(local - chrono::Duration::seconds(i64::from(before))))
            }
        }
    }

    fn period(&self, local: NaiveDateTime) -> Period {
        let id = if self.daily {
            local.format("%Y-%m-%d").to_string()
        } else {
            local.format("%Y-%m-%dT%H:%M:%S").to_string()
        };
        Period {
            id,
            fire: self.instant(local),
            local,
        }
    }

    fn local_now(&self, now: DateTime<Utc>) -> NaiveDateTime {
        now.with_timezone(&self.tz).naive_local()
    }

    /// The latest period that has started at or before `now`.
    pub fn current(&self, now: DateTime<Utc>) -> Option<Period> {
        let from = as_utc(self.local_now(now) + chrono::Duration::seconds(1));
        let mut back = self.cron.after(&from);
        (0..10_000)
            .map_while(|_| back.next_back())
            .map(|f| self.period(f.naive_utc()))
            .find(|p| p.fire <= now)
    }

    /// The first period that starts after `now`.
    pub fn next(&self, now: DateTime<Utc>) -> Option<Period> {
        // A fire time in a gap that has just passed starts later than its wall-clock time
        // suggests: look back across the gap when the offset changed in the last hours.
        let earlier = now - chrono::Duration::hours(3);
        let offset = |t: DateTime<Utc>| t.with_timezone(&self.tz).offset().fix();
        let start = if offset(earlier) == offset(now) {
            self.local_now(now)
        } else {
            self.local_now(earlier)
        };
        let from = as_utc(start - chrono::Duration::seconds(1));
        self.cron
            .after(&from)
            .take(100_000)
            .map(|f| self.period(f.naive_utc()))
            .find(|p| p.fire > now)
    }

    /// The periods that started after the instant `cursor` and at or before `now`, ordered by
    /// their start (then by id): the newest `cap` of them, and whether older ones were left
    /// out. Without a cursor, only the current period.
    ///
    /// The cursor is an instant, not a wall-clock time, because the mapping from wall-clock
    /// fire times to instants is not monotone across a DST change: 02:15 in a gap of
    /// 02:00–03:00 starts after 03:00 does (at 03:15), and in a fold 02:50 (first occurrence)
    /// starts before a later 02:10 (second occurrence). Near a transition the walk therefore
    /// looks [`DST_REACH`] beyond both ends on the wall clock and keeps exactly the fire times
    /// whose instant lies in `(cursor, now]`.
    pub fn since(
        &self,
        cursor: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        cap: usize,
    ) -> (Vec<Period>, bool) {
        let Some(cursor) = cursor else {
            return (self.current(now).into_iter().collect(), false);
        };
        let reach = |t: DateTime<Utc>| {
            if self.offset_changes_near(t) {
                DST_REACH
            } else {
                chrono::Duration::zero()
            }
        };
        let upper = as_utc(self.local_now(now) + reach(now) + chrono::Duration::seconds(1));
        let stop = self.local_now(cursor) - reach(cursor);
        let mut back = self.cron.after(&upper);
        let mut out = Vec::new();
        let mut truncated = false;
        while let Some(f) = back.next_back() {
            let local = f.naive_utc();
            if local < stop {
                break;
            }
            let p = self.period(local);
            let fire = p.fire.with_timezone(&Utc);
            if fire > now || fire <= cursor {
                continue;
            }
            if out.len() == cap {
                truncated = true;
                break;
            }
            out.push(p);
        }
        out.sort_by(|a, b| (a.fire, &a.id).cmp(&(b.fire, &b.id)));
        (out, truncated)
    }

    /// Whether the zone's UTC offset changes within [`DST_REACH`] of `t`.
    fn offset_changes_near(&self, t: DateTime<Utc>) -> bool {
        let offset = |t: DateTime<Utc>| t.with_timezone(&self.tz).offset().fix();
        offset(t - DST_REACH) != offset(t) || offset(t) != offset(t + DST_REACH)
    }

    /// A period of an earlier schedule, as its run record names it: `id` and its fire time
    /// `scheduled_at` (RFC 3339), read in this schedule's zone. A run that was open (or
    /// failed) when the job's schedule changed is finished (or run again) under the period it
    /// fired for; `None` when `scheduled_at` is not a time.
    pub fn period_of_record(&self, id: &str, scheduled_at: &str) -> Option<Period> {
        let fire = DateTime::parse_from_rfc3339(scheduled_at)
            .ok()?
            .with_timezone(&self.tz);
        Some(Period {
            id: id.to_string(),
            local: fire.naive_local(),
            fire,
        })
    }

    /// The period with id `id`, if the schedule has one.
    pub fn period_by_id(&self, id: &str) -> Option<Period> {
        if self.daily {
            let date = NaiveDate::parse_from_str(id, "%Y-%m-%d").ok()?;
            let fire = self
                .cron
                .after(&as_utc(
                    date.and_hms_opt(0, 0, 0)? - chrono::Duration::seconds(1),
                ))
                .next()?;
            (fire.date_naive() == date).then(|| self.period(fire.naive_utc()))
        } else {
            let local = NaiveDateTime::parse_from_str(id, "%Y-%m-%dT%H:%M:%S").ok()?;
            self.cron
                .includes(as_utc(local))
                .then(|| self.period(local))
        }
    }
}

#[cfg(test)]
mod tests;
