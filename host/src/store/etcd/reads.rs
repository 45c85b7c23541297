//! Reads of a job's keys and sets, and an operator's request: what the run bookkeeping of a
//! term's write ([`super::fenced`]) changes, read back.

use etcd_client::GetOptions;

use super::{EtcdResult, EtcdTerms, bounded, job_key, member_key};

/// Reads of a job's keys, and an operator's request, for what writes change ([`super::fenced`]).
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

    /// Sets one field of one of the job's hashes, unfenced: an operator's write (a request).
    pub async fn set_member(
        &self,
        job: &str,
        collection: &str,
        member: &str,
        value: &[u8],
    ) -> EtcdResult<()> {
        let mut c = self.client.clone();
        bounded(
            self.timeout,
            c.put(member_key(job, collection, member)?, value, None),
        )
        .await?;
        Ok(())
    }
}
