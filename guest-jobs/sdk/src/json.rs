//! Store values as JSON: [`write()`], [`create()`] and [`read()`] are `store.write`, `store.create`
//! and `store.read` with a `Serialize` value, and errors already mapped to [`JobError`] (see
//! its `From` implementations), so a step can use `?`.
//!
//! ```no_run
//! # fn step(period: &str) -> Result<(), leasehold_guest::JobError> {
//! use leasehold_guest::json;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Summary { customers: u64, total_cents: u64 }
//!
//! json::write(&format!("summary/{period}"), &Summary { customers: 3, total_cents: 1250 })?;
//! let back: Option<Summary> = json::read(&format!("summary/{period}"))?;
//! # Ok(()) }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{JobError, store};

/// Writes `value` as JSON under `key` (fenced; see `store.write`).
pub fn write<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<(), JobError> {
    store::write(key, &encode(key, value)?)?;
    Ok(())
}

/// Writes `value` as JSON under `key` only if the key does not exist yet (see `store.create`):
/// true if this call created it.
pub fn create<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<bool, JobError> {
    Ok(store::create(key, &encode(key, value)?)?)
}

/// Reads the JSON value under `key`: `None` if the key was never written. A value that is not
/// a `T` in JSON is [`JobError::Failed`] naming the key.
pub fn read<T: DeserializeOwned>(key: &str) -> Result<Option<T>, JobError> {
    store::read(key)?
        .map(|bytes| decode(key, &bytes))
        .transpose()
}

/// `value` as JSON; [`JobError::Failed`] naming `key` when JSON cannot hold it.
fn encode<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<Vec<u8>, JobError> {
    serde_json::to_vec(value)
        .map_err(|e| JobError::Failed(format!("{key}: the value cannot be written as JSON: {e}")))
}

/// The `T` in `bytes`; [`JobError::Failed`] naming `key` when they are not one.
fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, JobError> {
    serde_json::from_slice(bytes)
        .map_err(|e| JobError::Failed(format!("{key} does not hold the expected JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Summary {
        customers: u64,
        total_cents: u64,
    }

    #[test]
    fn a_value_round_trips_through_its_json() {
        let s = Summary {
            customers: 3,
            total_cents: 1250,
        };
        let bytes = encode("summary/2026-11-27", &s).unwrap();
        assert_eq!(bytes, br#"{"customers":3,"total_cents":1250}"#);
        assert_eq!(decode::<Summary>("summary/2026-11-27", &bytes), Ok(s));
    }

    #[test]
    fn a_value_of_another_shape_fails_naming_the_key() {
        match decode::<Summary>("summary/2026-11-27", b"customers=3") {
            Err(JobError::Failed(m)) => assert!(
                m.starts_with("summary/2026-11-27 does not hold the expected JSON: "),
                "{m}"
            ),
            other => panic!("expected failed, got {other:?}"),
        }
    }
}
