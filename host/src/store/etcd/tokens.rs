//! Tokens on etcd that continue the tokens of another store: a term's token is the cluster's
//! **token base** plus its lease key's create revision (`docs/store-contract.md`, section 1).
//!
//! **Why.** Revisions are small numbers, while the Redis store's tokens are microseconds since
//! the epoch, and the databases a job writes to (PostgreSQL's fence) keep the highest token they
//! saw: a job moved from Redis to etcd with bare revisions as tokens would be refused by its own
//! fence. So the base is set once per cluster, by the first client that finds none, to its
//! clock's microseconds since the epoch (as the Redis store's tokens are taken from Redis's
//! clock): every token after it is above every token a store handed out before that moment
//! (clocks roughly agreeing), and below 2^53 for centuries. A cluster that lost everything
//! starts again from a later clock, so its tokens stay above the old ones.
//!
//! **How.** The base is the key `lh/{tokens}/base`, a zero-padded decimal (byte order is
//! numeric order). A campaign compares the base its client believes in the same transaction that
//! creates the term's key ([`EtcdTerms::campaign`]), so a won term's token is exactly base plus
//! revision; a campaign that finds another base reads it and tries again. The base only grows
//! ([`EtcdTerms::raise_tokens`]: after a database's fence showed a token above this store's),
//! and revisions only grow, so every later term of a job has a higher token than every earlier
//! one. The history keeps each term's base in its entry ([`super::history`]).

use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::{EtcdResult, EtcdTerms, bounded};

/// The key of the cluster's token base.
pub(super) const BASE: &str = "lh/{tokens}/base";

/// Tokens stay below this (JSON numbers and PostgreSQL's fence read them exactly).
const LIMIT: i64 = 1 << 53;

/// Tries of a raise whose base changed between its read and its write.
const RAISE_ATTEMPTS: usize = 8;

/// `base` as stored: 16 digits, zero-padded.
pub(super) fn padded(base: i64) -> String {
    format!("{base:016}")
}

/// A stored base, or an error naming the key when it is not one.
fn parse(value: &[u8]) -> EtcdResult<i64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|b| (0..LIMIT).contains(b))
        .ok_or_else(|| {
            etcd_client::Error::InvalidArgs(format!(
                "{BASE} holds {:?}, not a token base",
                String::from_utf8_lossy(value)
            ))
        })
}

/// The base a transaction's `get` of [`BASE`] found (`None`: no base).
pub(super) fn base_of(replies: &[TxnOpResponse]) -> EtcdResult<Option<i64>> {
    for r in replies {
        if let TxnOpResponse::Get(g) = r
            && let Some(kv) = g.kvs().first()
            && kv.key() == BASE.as_bytes()
        {
            return parse(kv.value()).map(Some);
        }
    }
    Ok(None)
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl EtcdTerms {
    /// Whether the cluster answers a linearizable read (a count of the token base): only a
    /// member in touch with a quorum does.
    pub async fn ping(&self) -> EtcdResult<()> {
        let mut c = self.client.clone();
        let count_only = etcd_client::GetOptions::new().with_count_only();
        bounded(self.timeout, c.get(BASE, Some(count_only))).await?;
        Ok(())
    }

    /// The cluster's token base as this client last saw it; read, or set from this host's
    /// clock when the cluster has none, the first time.
    pub(super) async fn token_base(&self) -> EtcdResult<i64> {
        if let Some(base) = *self.base.lock().expect("token base lock") {
            return Ok(base);
        }
        let mut c = self.client.clone();
        let ours = now_micros();
        let txn = Txn::new()
            .when([Compare::create_revision(BASE, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(BASE, padded(ours), None)])
            .or_else([TxnOp::get(BASE, None)]);
        let reply = bounded(self.timeout, c.txn(txn)).await?;
        let base = if reply.succeeded() {
            ours
        } else {
            base_of(reply.op_responses().as_slice())?
                .ok_or_else(|| etcd_client::Error::InvalidArgs(format!("{BASE} vanished")))?
        };
        self.learn_base(Some(base));
        Ok(base)
    }

    /// Remembers the base a transaction found (`None`: the cluster has none, read it again).
    pub(super) fn learn_base(&self, base: Option<i64>) {
        *self.base.lock().expect("token base lock") = base;
    }

    /// Raises the token base so that every term won from now on has a token above `token`
    /// (never lowers it): a database's fence holds a token this store has not reached. True
    /// when the base was raised. The tokens of terms that hold their jobs now are unchanged.
    pub async fn raise_tokens(&self, token: u64) -> EtcdResult<bool> {
        let wanted = i64::try_from(token)
            .ok()
            .filter(|t| *t < LIMIT)
            .ok_or_else(|| {
                etcd_client::Error::InvalidArgs(format!("token {token} is past 2^53"))
            })?;
        let mut c = self.client.clone();
        for _ in 0..RAISE_ATTEMPTS {
            let base = self.token_base().await?;
            // Every revision is at least 1, so a base of `wanted` puts every later token above it.
            if base >= wanted {
                return Ok(false);
            }
            let txn = Txn::new()
                .when([Compare::value(BASE, CompareOp::Equal, padded(base))])
                .and_then([TxnOp::put(BASE, padded(wanted), None)])
                .or_else([TxnOp::get(BASE, None)]);
            let reply = bounded(self.timeout, c.txn(txn)).await?;
            if reply.succeeded() {
                self.learn_base(Some(wanted));
                return Ok(true);
            }
            self.learn_base(base_of(reply.op_responses().as_slice())?);
        }
        Err(etcd_client::Error::InvalidArgs(format!(
            "{BASE} kept changing: not raised in {RAISE_ATTEMPTS} tries"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_stored_in_numeric_byte_order_and_read_back_strictly() {
        let (a, b) = (padded(999_999), padded(1_765_000_000_000_000));
        assert!(a < b, "byte order is numeric order");
        assert_eq!(parse(b.as_bytes()).unwrap(), 1_765_000_000_000_000);
        for bad in ["", "-1", "x", "9007199254740992"] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
