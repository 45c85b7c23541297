//! A step's state as JSON: [`load`] what the previous step returned, [`save`] what the next one
//! needs.
//!
//! The host keeps the state as a fenced checkpoint between steps, possibly for a step on
//! another replica after a failover, and never reads it. A state must fit in the job's
//! `max-write-bytes`; a larger one fails the run.
//!
//! ```
//! use leasehold_guest::{StepOutcome, state};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Progress { next_customer: usize }
//!
//! let first: Progress = state::load(None)?; // step 0: the default
//! assert_eq!(first.next_customer, 0);
//! let StepOutcome::Continue(bytes) = state::save(&Progress { next_customer: 50 })? else { panic!() };
//! let again: Progress = state::load(Some(bytes))?;
//! assert_eq!(again.next_customer, 50);
//! # Ok::<(), leasehold_guest::JobError>(())
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{JobError, StepOutcome};

/// The state `run-step` was given: `T::default()` for `None` (step 0), otherwise the JSON a
/// previous step saved. A state that is not such JSON is [`JobError::Failed`] (`checkpoint is
/// not this job's state: ...`): it was saved by a different version of the job, or a bug.
pub fn load<T: DeserializeOwned + Default>(state: Option<Vec<u8>>) -> Result<T, JobError> {
    match state {
        None => Ok(T::default()),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| JobError::Failed(format!("checkpoint is not this job's state: {e}"))),
    }
}

/// [`StepOutcome::Continue`] with `state` as JSON: the host saves it and calls the next step
/// with it. A state that cannot be written as JSON (a map with non-string keys, say) is
/// [`JobError::Failed`].
pub fn save<T: Serialize + ?Sized>(state: &T) -> Result<StepOutcome, JobError> {
    to_json(state).map(StepOutcome::Continue)
}

/// [`StepOutcome::AwaitTasks`] with `state` as JSON (a fan-out job, see [`crate::fan_out`]):
/// the host saves it and calls the next step with it once every task the run submitted has
/// finished.
pub fn await_tasks<T: Serialize + ?Sized>(state: &T) -> Result<StepOutcome, JobError> {
    to_json(state).map(StepOutcome::AwaitTasks)
}

fn to_json<T: Serialize + ?Sized>(state: &T) -> Result<Vec<u8>, JobError> {
    serde_json::to_vec(state)
        .map_err(|e| JobError::Failed(format!("the state cannot be saved as JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Progress {
        next: usize,
        charged: u64,
        seen: Vec<String>,
    }

    fn bytes(outcome: StepOutcome) -> Vec<u8> {
        match outcome {
            StepOutcome::Continue(b) => b,
            other => panic!("save returned {other:?}"),
        }
    }

    #[test]
    fn awaiting_tasks_saves_the_same_state() {
        let p = Progress::default();
        assert_eq!(
            await_tasks(&p).unwrap(),
            StepOutcome::AwaitTasks(bytes(save(&p).unwrap()))
        );
    }

    #[test]
    fn step_zero_starts_from_the_default() {
        assert_eq!(load::<Progress>(None), Ok(Progress::default()));
    }

    #[test]
    fn a_saved_state_loads_back_the_same() {
        let p = Progress {
            next: 50,
            charged: 48,
            seen: vec!["c1".into(), "c2".into()],
        };
        let b = bytes(save(&p).unwrap());
        assert_eq!(b, br#"{"next":50,"charged":48,"seen":["c1","c2"]}"#);
        assert_eq!(load::<Progress>(Some(b)), Ok(p));
    }

    #[test]
    fn a_state_of_another_shape_fails_the_step() {
        match load::<Progress>(Some(b"50 48 2".to_vec())) {
            Err(JobError::Failed(m)) => {
                assert!(m.starts_with("checkpoint is not this job's state: "), "{m}")
            }
            other => panic!("expected failed, got {other:?}"),
        }
    }

    #[test]
    fn a_state_json_cannot_hold_fails_the_step() {
        let mut m = BTreeMap::new();
        m.insert((1, 2), 3);
        match save(&m) {
            Err(JobError::Failed(m)) => {
                assert!(m.starts_with("the state cannot be saved as JSON: "), "{m}")
            }
            other => panic!("expected failed, got {other:?}"),
        }
    }
}
