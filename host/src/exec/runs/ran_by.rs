//! Who ran a run: the terms that wrote its record ([`RanBy`], the record's `ran_by`), added by
//! the fenced save that writes the record, so only a term whose write the fence accepted is
//! listed.

use serde::{Deserialize, Serialize};

use super::RunRecord;

/// A term that wrote a run's record: its token and node, the attempt and the step it took the
/// run at (the steps completed when it first wrote the record). A run resumed by a successor,
/// handed over between steps or retried has one per term that ran it, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RanBy {
    /// The term's fencing token.
    pub token: u64,
    /// The node that led it.
    pub node: String,
    /// The run's attempt it worked on.
    pub attempt: u32,
    /// The steps completed when it first wrote the record.
    pub from_step: u32,
}

/// The most terms a record lists (the oldest are dropped).
pub const RAN_BY_KEPT: usize = 16;

impl RunRecord {
    /// Notes that the term of `token` on `node` writes the record now: a new entry in
    /// [`RunRecord::ran_by`] unless the newest is already this term's for this attempt. Only a
    /// term that runs the attempt is listed: a record written `pending` (a retry's back-off, a
    /// re-run requested), `cancelled` or not run at all adds none.
    pub fn note_writer(&mut self, token: u64, node: &str) {
        use super::RunStatus::{Done, Failed, Running, Waiting};
        if !matches!(self.status, Running | Waiting | Done | Failed) {
            return;
        }
        let same = self
            .ran_by
            .last()
            .is_some_and(|r| r.token == token && r.attempt == self.attempt);
        if !same {
            self.ran_by.push(RanBy {
                token,
                node: node.to_string(),
                attempt: self.attempt,
                from_step: self.step,
            });
            if self.ran_by.len() > RAN_BY_KEPT {
                self.ran_by.remove(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::runs::RunStatus;

    #[test]
    fn a_term_is_listed_once_per_attempt_from_the_step_it_took_the_run_at() {
        let p = crate::exec::spec::Schedule::parse("0 0 2 * * *", "UTC")
            .unwrap()
            .period_by_id("2026-11-27")
            .unwrap();
        let mut r = RunRecord::new(&p, RunStatus::Running, "2026-11-27T02:00:00.000Z");
        r.status = RunStatus::Pending;
        r.note_writer(5, "n0");
        r.status = RunStatus::Running;
        r.note_writer(7, "n1");
        r.step = 2;
        r.note_writer(7, "n1");
        r.note_writer(9, "n2");
        r.attempt = 2;
        r.step = 0;
        r.note_writer(9, "n2");
        let listed: Vec<(u64, &str, u32, u32)> = r
            .ran_by
            .iter()
            .map(|t| (t.token, t.node.as_str(), t.attempt, t.from_step))
            .collect();
        assert_eq!(listed, [(7, "n1", 1, 0), (9, "n2", 1, 2), (9, "n2", 2, 0)]);
        for token in 10..40 {
            r.note_writer(token, "n3");
        }
        assert_eq!(r.ran_by.len(), RAN_BY_KEPT);
        assert_eq!(r.ran_by.last().unwrap().token, 39);
    }
}
