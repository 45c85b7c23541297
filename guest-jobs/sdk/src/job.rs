//! A job written as typed-state steps: [`Job`] and [`job!`](crate::job!).
//!
//! The world's `run-step` hands a step its state as bytes and wants an outcome; most jobs load
//! the state, check the term, do one piece of work and save the state again. [`Job`] does the
//! bytes and the check for them: a step gets its state as a `&mut Self::State` (JSON between
//! steps, [`Default`] at step 0), runs only while the term still leads (otherwise the step ends
//! as `lost-leadership` before the job's code runs), and says whether the run goes on.
//!
//! ```
//! use leasehold_guest::prelude::*;
//!
//! struct Hello;
//!
//! impl Job for Hello {
//!     type State = ();
//!     fn spec() -> JobSpec { spec("hello").schedule("0 0 2 * * *").build() }
//!     fn step(_term: &Term, run: &RunInfo, _state: &mut ()) -> Result<Next, JobError> {
//!         leasehold_guest::store::write(&format!("hello/{}", run.period), b"hi")?;
//!         Ok(Next::Done)
//!     }
//! }
//!
//! leasehold_guest::job!(Hello);
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{JobError, JobSpec, RunInfo, StepOutcome, Term, state};

/// What a step of a [`Job`] says about its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Call the next step with the state as this step left it.
    Continue,
    /// The run is complete.
    Done,
}

/// A job whose steps work on a typed state. Export it with [`job!`](crate::job!), which also
/// implements [`crate::Guest`] for it.
pub trait Job {
    /// The state between steps: `Default` at step 0, JSON in the checkpoint.
    type State: Default + Serialize + DeserializeOwned;
    /// The job's spec (the world's `describe`).
    fn spec() -> JobSpec;
    /// The databases its steps use through the `sql` import (the world's `databases`): each is
    /// granted as the host's database of that name unless the job's sidecar maps it to
    /// another; a host without one refuses the job. None unless overridden.
    fn databases() -> Vec<String> {
        Vec::new()
    }
    /// One step: runs only while `term` still leads; the state it leaves is saved with
    /// [`Next::Continue`].
    fn step(term: &Term, run: &RunInfo, state: &mut Self::State) -> Result<Next, JobError>;
}

/// `run-step` for a [`Job`]: load the state, check the term, run the step, save the state.
#[doc(hidden)]
pub fn run_step<J: Job>(
    term: &Term,
    run: &RunInfo,
    saved: Option<Vec<u8>>,
) -> Result<StepOutcome, JobError> {
    let mut st: J::State = state::load(saved)?;
    term.ensure_leader()?;
    match J::step(term, run, &mut st)? {
        Next::Continue => state::save(&st),
        Next::Done => Ok(StepOutcome::Done),
    }
}

/// What every step checks before it acts: [`LeaderCheck::ensure_leader`].
pub trait LeaderCheck {
    /// `Err(JobError::LostLeadership)` once the term no longer leads, so a step writes
    /// `term.ensure_leader()?;` before work that should not start late. (A write of an ended
    /// term is refused by the fence anyway; this saves the work.)
    fn ensure_leader(&self) -> Result<(), JobError>;
}

impl LeaderCheck for Term {
    fn ensure_leader(&self) -> Result<(), JobError> {
        if self.still_leader() {
            Ok(())
        } else {
            Err(JobError::LostLeadership)
        }
    }
}

/// Exports a [`Job`] as the component's `job` world: implements [`crate::Guest`] for it and
/// calls [`export!`](crate::export). A crate calls it once, instead of `export!`.
#[macro_export]
macro_rules! job {
    ($job:ident) => {
        impl $crate::Guest for $job {
            fn describe() -> $crate::JobSpec {
                <$job as $crate::Job>::spec()
            }

            fn databases() -> ::std::vec::Vec<::std::string::String> {
                <$job as $crate::Job>::databases()
            }

            fn run_step(
                term: &$crate::Term,
                run: $crate::RunInfo,
                _step: u32,
                state: ::core::option::Option<::std::vec::Vec<u8>>,
            ) -> ::core::result::Result<$crate::StepOutcome, $crate::JobError> {
                $crate::job::run_step::<$job>(term, &run, state)
            }
        }
        $crate::export!($job);
    };
}
