//! Test fixture: a job built to world 0.4.2 (`wit/v0.4.2`), the world with the `sql` import and
//! before the `databases` export. Its one step books a charge for customer `oldsql` in the
//! `ledger` database (table `charges`, as the sql tests make it) under its term's token: tests
//! show that the host, on world 0.4.3, still loads and runs such a component, its database
//! granted by its sidecar.

wit_bindgen::generate!({ world: "job", path: "../../wit/v0.4.2" });

use leasehold::job::sql::{self, SqlError, Value};
use leasehold::job::types::{CatchUp, Limits, Overlap, Policies};

struct OldSql;

impl Guest for OldSql {
    fn describe() -> JobSpec {
        JobSpec {
            name: "oldsql".into(),
            schedule: "0 0 0 1 1 *".into(),
            time_zone: "UTC".into(),
            limits: Limits {
                max_memory_bytes: 0,
                max_step_millis: 0,
                max_write_bytes: 0,
                max_stored_keys: 0,
                max_stored_bytes: 0,
            },
            policies: Policies {
                catch_up: CatchUp::Latest,
                catch_up_window_millis: 0,
                retry_attempts: 0,
                retry_backoff_millis: 0,
                retry_max_backoff_millis: 0,
                overlap: Overlap::Queue,
                max_run_millis: 0,
            },
        }
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        _step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let booked = sql::execute(
            "ledger",
            "INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[
                Value::Text("oldsql".into()),
                Value::Text(run.period.clone()),
                Value::Int(term.token() as i64),
            ],
        );
        match booked {
            Ok(_) => Ok(StepOutcome::Done),
            Err(SqlError::Fenced(_) | SqlError::NotLeader) => Err(JobError::LostLeadership),
            Err(e) => Err(JobError::Failed(format!("{e:?}"))),
        }
    }
}

export!(OldSql);
