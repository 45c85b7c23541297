//! The Redis key layout. Every key of one job shares the hash tag `{job}`, so each script
//! touches a single slot and works unchanged on Redis Cluster.
//!
//! The layout (key, type, writer, contents) is tabled in one place: ARCHITECTURE.md, "Redis key
//! layout". Every key is built by a method here; change the table with the method.
//!
//! Channel `lh:{job}:released` (pub/sub, not a key): the release script publishes the old
//! owner there, so followers campaign at once instead of waiting for the TTL. Channel
//! `lh:{job}:notify`: operators' requests and pause flags, and a member asking for the job,
//! publish there, so the leader's runner reads its state at once.

/// The member of a job's run index that says it was built (records written before the index
/// existed were indexed); never a period (periods start with a digit).
pub const INDEXED: &str = ".indexed";

/// The sorted set of live members (node id → expiry, ms of Redis's clock).
pub const MEMBERS_LIVE: &str = "lh:{members}:live";
/// The hash of member descriptions (node id → [`crate::coord::members::MemberInfo`] as JSON).
pub const MEMBERS_INFO: &str = "lh:{members}:info";
/// The hash of the jobs each member serves (node id → job names, one per line), written by the
/// member after each scan of its jobs directory once the files present at its start have
/// loaded, and dropped with the member ([`crate::coord::members::publish_jobs`]).
pub const MEMBERS_JOBS: &str = "lh:{members}:jobs";
/// The channel a member's first registration publishes on (its node id): the other hosts
/// read the membership at once instead of at their next heartbeat. It matches the notice
/// pattern (`lh:{*}:notify`) the hosts already listen to.
pub const MEMBERS_JOINED: &str = "lh:{members}:notify";

/// Pattern matching every job's release channel (`PSUBSCRIBE`; `{` and `}` are literal in
/// Redis patterns).
pub const RELEASED_PATTERN: &str = "lh:{*}:released";

/// Pattern matching every job's notice channel: an operator's trigger, pause or resume, a
/// member asking for the job, or the job's tasks finishing, wakes the job's runner at once
/// instead of at its next poll.
pub const NOTICE_PATTERN: &str = "lh:{*}:notify";

/// Pattern matching every job's work channel: tasks submitted or queued again wake every
/// host's workers for the job.
pub const WORK_PATTERN: &str = "lh:{*}:work";

/// The keys of one job. Cheap to clone; built once per job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobKeys {
    prefix: String,
}

impl JobKeys {
    /// Keys for the job named `job` (a validated job name, see [`crate::exec::spec`]).
    pub fn new(job: &str) -> Self {
        JobKeys {
            prefix: format!("lh:{{{job}}}:"),
        }
    }

    /// `key` without the job's prefix (`cursor` for `lh:{job}:cursor`), if it is one of the
    /// job's keys: how the etcd store names the job's keys under its own prefix.
    pub fn rest<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())
    }

    /// The job's key `rest` (what [`JobKeys::rest`] gives back).
    pub fn of(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.prefix["lh:{".len()..self.prefix.len() - "}:".len()]
    }

    /// The lease: owner of the current term, expiring after the lease TTL.
    pub fn lease(&self) -> String {
        format!("{}lease", self.prefix)
    }

    /// The scheduler's cursor: the newest period accounted for.
    pub fn cursor(&self) -> String {
        format!("{}cursor", self.prefix)
    }

    /// The period of the job's newest run that ended (`done` or `failed`).
    pub fn last_run(&self) -> String {
        format!("{}last", self.prefix)
    }

    /// Present while an operator has paused the job.
    pub fn paused(&self) -> String {
        format!("{}paused", self.prefix)
    }

    /// The run index: every period with a run record (or one moved aside), a sorted set read
    /// newest first by the run history, so it never scans the keyspace.
    pub fn runs(&self) -> String {
        format!("{}runs", self.prefix)
    }

    /// `SCAN` pattern of every run record of the job (for indexing records written before the
    /// run index existed).
    pub fn run_pattern(&self) -> String {
        // `{`, `}` and `:` are literal in patterns.
        format!("{}run:*", self.prefix)
    }

    /// The node id of the job's preferred member while it follows the job and asks for it
    /// (set by the acquire script, expiring after twice the lease TTL).
    pub fn wanted(&self) -> String {
        format!("{}wanted", self.prefix)
    }

    /// The token counter.
    pub fn token(&self) -> String {
        format!("{}token", self.prefix)
    }

    /// The fence: highest accepted token and its holder.
    pub fn fence(&self) -> String {
        format!("{}fence", self.prefix)
    }

    /// The term history: a capped list of the job's terms, newest first, written by the lease
    /// scripts (see [`crate::coord::terms`]).
    pub fn terms(&self) -> String {
        format!("{}terms", self.prefix)
    }

    /// A guest key inside the job's namespace. `key` must already be validated.
    pub fn data(&self, key: &str) -> String {
        format!("{}data:{key}", self.prefix)
    }

    /// The run record of a period.
    pub fn run(&self, period: &str) -> String {
        self.of(&Self::run_rest(period))
    }

    /// [`JobKeys::run`] without the job's prefix (what the seam's reads take).
    pub fn run_rest(period: &str) -> String {
        format!("run:{period}")
    }

    /// The checkpoint (state for the next step) of a period's run.
    pub fn checkpoint(&self, period: &str) -> String {
        self.of(&Self::checkpoint_rest(period))
    }

    /// [`JobKeys::checkpoint`] without the job's prefix (what the seam's reads take).
    pub fn checkpoint_rest(period: &str) -> String {
        format!("ckpt:{period}")
    }

    /// Periods whose run is open (`running` or `waiting`), so a new leader finds them.
    pub fn open_runs(&self) -> String {
        format!("{}open", self.prefix)
    }

    /// Pub/sub channel announcing that the lease was released.
    pub fn released_channel(&self) -> String {
        format!("{}released", self.prefix)
    }

    /// The channel where the job's inputs announce a change (a request, the pause flag, a
    /// member asking for the job): the leader's runner reads its state at once.
    pub fn notice_channel(&self) -> String {
        format!("{}notify", self.prefix)
    }

    /// Operator requests (hash: period → `<request id> <what the operator saw>`). Named
    /// `requested`: earlier versions kept a set at `requests`, which is no longer read.
    pub fn requests(&self) -> String {
        format!("{}requested", self.prefix)
    }

    /// Where an unreadable run record of `period` is kept for the operator, moved aside so it
    /// blocks nothing.
    pub fn corrupt(&self, period: &str) -> String {
        self.of(&Self::corrupt_rest(period))
    }

    /// [`JobKeys::corrupt`] without the job's prefix (what the seam's reads take).
    pub fn corrupt_rest(period: &str) -> String {
        format!("corrupt:{period}")
    }

    /// What the fenced write with id `id` answered, kept 60 s for a resend of the same call
    /// (see [`crate::coord::fence::TermWrite::id`]).
    pub fn applied(&self, id: &str) -> String {
        format!("{}applied:{id}", self.prefix)
    }

    /// A request for `period` that its leader refused (not a period of the job's schedule,
    /// and no record): JSON like a run record, status `refused`, shown in the run history.
    pub fn refused(&self, period: &str) -> String {
        self.of(&Self::refused_rest(period))
    }

    /// [`JobKeys::refused`] without the job's prefix (what the seam's reads take).
    pub fn refused_rest(period: &str) -> String {
        format!("refused:{period}")
    }

    /// The job's schedule as its current leader runs it (JSON `schedule`, `time_zone`),
    /// published at each term's start (a fenced write) so that `leasehold trigger`, which does
    /// not load the component, can check a period against it.
    pub fn schedule(&self) -> String {
        self.of(Self::SCHEDULE_REST)
    }

    /// [`JobKeys::schedule`] without the job's prefix (what the seam's reads take).
    pub const SCHEDULE_REST: &'static str = "schedule";

    /// What the job keeps in its store (hash: `keys`, `bytes`), counted by the fenced-write
    /// script with every guest write (see [`crate::coord::quota`]).
    pub fn usage(&self) -> String {
        format!("{}usage", self.prefix)
    }

    /// The job's task stream (fan-out): one entry per task attempt, read by every host's
    /// workers through the consumer group [`crate::exec::tasks::GROUP`].
    pub fn tasks(&self) -> String {
        format!("{}tasks", self.prefix)
    }

    /// The tasks of `period`'s run (hash: `t:<id>` → the task's record as JSON, and the
    /// counters `n:submitted`, `n:finished`, `n:failed`).
    pub fn task_runs(&self, period: &str) -> String {
        format!("{}task:{period}", self.prefix)
    }

    /// The payloads and outputs of `period`'s tasks (hash: `p:<id>`, `o:<id>`).
    pub fn task_data(&self, period: &str) -> String {
        format!("{}taskdata:{period}", self.prefix)
    }

    /// The channel where the job's tasks announce work (a task submitted or queued again): every
    /// host's workers for the job fetch at once.
    pub fn work_channel(&self) -> String {
        format!("{}work", self.prefix)
    }

    /// `SCAN` pattern of every corrupt record kept aside.
    pub fn corrupt_pattern(&self) -> String {
        format!("{}corrupt:*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_job_shares_its_hash_tag() {
        let k = JobKeys::new("recon");
        for key in [
            k.lease(),
            k.token(),
            k.fence(),
            k.data("a/b"),
            k.run("2026-11-27"),
            k.checkpoint("2026-11-27"),
            k.requests(),
            k.open_runs(),
        ] {
            assert!(key.starts_with("lh:{recon}:"), "{key}");
        }
        assert_eq!(k.data("report/x"), "lh:{recon}:data:report/x");
        assert_eq!(k.job(), "recon");
    }
}
