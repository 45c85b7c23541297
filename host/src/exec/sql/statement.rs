//! One statement on a connection ([`run_statement`]): prepared once per connection, run with the
//! guest's parameters, its rows read within the job's limits.

use std::collections::HashMap;

use tokio_postgres::{Client, Statement};

use super::pool::STATEMENTS_KEPT;
use super::tx::Ran;
use super::{SqlError, SqlLimits, Value, value};

/// Runs `statement` with `params` on `client` (prepared once per connection, kept in
/// `statements`), within the rows and bytes of `limits`: its rows, or with `count`, only how
/// many rows it changed.
pub(super) async fn run_statement(
    client: &Client,
    statements: &mut HashMap<String, Statement>,
    statement: &str,
    params: &[Value],
    count: bool,
    limits: &SqlLimits,
) -> Result<Ran, SqlError> {
    let limit = limits.statement_time;
    let (rows_cap, bytes_cap) = (limits.rows, limits.result_bytes);
    let stmt = match statements.get(statement) {
        Some(s) => s.clone(),
        None => {
            let s = client
                .prepare(statement)
                .await
                .map_err(|e| SqlError::from_pg(e, limit))?;
            if statements.len() >= STATEMENTS_KEPT {
                statements.clear();
            }
            statements.insert(statement.to_string(), s.clone());
            s
        }
    };
    if stmt.params().len() != params.len() {
        return Err(SqlError::Refused(format!(
            "the statement takes {} parameters and {} were given",
            stmt.params().len(),
            params.len()
        )));
    }
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        params.iter().map(|p| p as _).collect();
    if count {
        let n = client
            .execute(&stmt, &refs)
            .await
            .map_err(|e| SqlError::from_pg(e, limit))?;
        return Ok((Vec::new(), Vec::new(), n));
    }
    let columns: Vec<String> = stmt
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let stream = client
        .query_raw(&stmt, refs)
        .await
        .map_err(|e| SqlError::from_pg(e, limit))?;
    use futures_util::TryStreamExt as _;
    let mut stream = std::pin::pin!(stream);
    let mut rows = Vec::new();
    let mut bytes = 0u64;
    while let Some(row) = stream
        .try_next()
        .await
        .map_err(|e| SqlError::from_pg(e, limit))?
    {
        if rows.len() as u64 >= rows_cap {
            return Err(SqlError::TooLarge(format!(
                "more than the job's {rows_cap} rows per statement"
            )));
        }
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            let v = value::column(&row, i).map_err(SqlError::Unsupported)?;
            bytes += v.size() as u64;
            values.push(v);
        }
        if bytes > bytes_cap {
            return Err(SqlError::TooLarge(format!(
                "more than the job's {} per statement",
                crate::units::show_size(bytes_cap)
            )));
        }
        rows.push(values);
    }
    let n = rows.len() as u64;
    Ok((columns, rows, n))
}
