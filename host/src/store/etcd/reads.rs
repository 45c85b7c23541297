//! Reads of a job's keys and sets: what the run bookkeeping of a term's write
//! ([`super::fenced`]) changes, read back.

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use super::{EtcdResult, EtcdTerms, bounded, job_key, member_key};

/// What a leader reads of its job every round, as [`EtcdTerms::job_state`] found it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobStateRead {
    /// Operators' requests: period → request.
    pub requests: Vec<(String, Vec<u8>)>,
    /// The open-runs set's members (with their values, empty).
    pub open: Vec<(String, Vec<u8>)>,
    /// The job's `paused` key.
    pub paused: Option<Vec<u8>>,
    /// The job's `cursor` key.
    pub cursor: Option<Vec<u8>>,
    /// The job's `wanted` key.
    pub wanted: Option<Vec<u8>>,
    /// Whether the run index holds its built marker.
    pub indexed: bool,
}

/// Reads of a job's keys, for what writes change ([`super::fenced`]).
impl EtcdTerms {
    /// The job's `key` (a job key as [`super::EtcdWrite`] names them), as the cluster's leader has it.
    pub async fn get(&self, job: &str, key: &str) -> EtcdResult<Option<Vec<u8>>> {
        let mut c = self.client.clone();
        let got = bounded(self.timeout, c.get(job_key(job, key)?, None)).await?;
        Ok(got.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The members of one of the job's sets (`open`, `runs`) or the fields of one of its hashes
    /// (`requests`), in key order, with their values.
    pub async fn members(&self, job: &str, collection: &str) -> EtcdResult<Vec<(String, Vec<u8>)>> {
        let prefix = member_key(job, collection, "")?;
        let mut c = self.client.clone();
        let got = bounded(
            self.timeout,
            c.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        Ok(got
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    /// The last `limit` members of one of the job's sets (`runs`), in descending key order.
    pub async fn last_members(
        &self,
        job: &str,
        collection: &str,
        limit: usize,
    ) -> EtcdResult<Vec<String>> {
        let prefix = member_key(job, collection, "")?;
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(limit as i64);
        let mut c = self.client.clone();
        let got = bounded(self.timeout, c.get(prefix.clone(), Some(options))).await?;
        Ok(got
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned())
            .collect())
    }

    /// The job's `keys`, in order: one read-only transaction for every `--max-txn-ops` keys,
    /// sent one after another (each chunk read at one revision, the chunks at their own).
    pub async fn get_many(&self, job: &str, keys: &[String]) -> EtcdResult<Vec<Option<Vec<u8>>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(self.max_txn_ops.max(1)) {
            let gets = chunk
                .iter()
                .map(|k| Ok(TxnOp::get(job_key(job, k)?, None)))
                .collect::<EtcdResult<Vec<_>>>()?;
            let mut c = self.client.clone();
            let reply = bounded(self.timeout, c.txn(Txn::new().and_then(gets))).await?;
            for r in reply.op_responses() {
                match r {
                    TxnOpResponse::Get(g) => {
                        out.push(g.kvs().first().map(|kv| kv.value().to_vec()))
                    }
                    _ => {
                        return Err(etcd_client::Error::InvalidArgs(
                            "etcd answered a read with something else".into(),
                        ));
                    }
                }
            }
        }
        if out.len() != keys.len() {
            return Err(etcd_client::Error::InvalidArgs(
                "etcd answered a read of many keys short".into(),
            ));
        }
        Ok(out)
    }

    /// The job's requests, open runs, `paused`, `cursor` and `wanted` keys and the run index's
    /// built marker, in one read-only transaction (one revision: every part read at once).
    pub async fn job_state(&self, job: &str) -> EtcdResult<JobStateRead> {
        let requests = member_key(job, "requests", "")?;
        let open = member_key(job, "open", "")?;
        let prefixed = || Some(GetOptions::new().with_prefix());
        let txn = Txn::new().and_then([
            TxnOp::get(requests.clone(), prefixed()),
            TxnOp::get(open.clone(), prefixed()),
            TxnOp::get(job_key(job, "paused")?, None),
            TxnOp::get(job_key(job, "cursor")?, None),
            TxnOp::get(job_key(job, "wanted")?, None),
            TxnOp::get(
                member_key(job, "runs", crate::store::keys::INDEXED)?,
                Some(GetOptions::new().with_count_only()),
            ),
        ]);
        let mut c = self.client.clone();
        let reply = bounded(self.timeout, c.txn(txn)).await?;
        let gets: Vec<_> = reply
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(g) => Ok(g),
                _ => Err(etcd_client::Error::InvalidArgs(
                    "etcd answered a read with something else".into(),
                )),
            })
            .collect::<EtcdResult<_>>()?;
        let [requested, opened, paused, cursor, wanted, indexed] = <[_; 6]>::try_from(gets)
            .map_err(|_| {
                etcd_client::Error::InvalidArgs("etcd answered a job's state short".into())
            })?;
        let members = |g: &etcd_client::GetResponse, prefix: &str| {
            g.kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                        kv.value().to_vec(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let value = |g: &etcd_client::GetResponse| g.kvs().first().map(|kv| kv.value().to_vec());
        Ok(JobStateRead {
            requests: members(&requested, &requests),
            open: members(&opened, &open),
            paused: value(&paused),
            cursor: value(&cursor),
            wanted: value(&wanted),
            indexed: indexed.count() > 0,
        })
    }
}
