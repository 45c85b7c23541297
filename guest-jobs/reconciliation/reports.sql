-- The reconciliation's table in the accounting database: one row per day, written by the job's
-- last step in a transaction fenced by its term's token (recorded in `token`). Create it as the
-- database's owner, then grant the job's role (the one its URL logs in as):
--   GRANT SELECT, INSERT, UPDATE ON reconciliation_reports TO <role>;
CREATE TABLE IF NOT EXISTS reconciliation_reports (
    period text PRIMARY KEY,
    matched bigint NOT NULL,
    amount_mismatches bigint NOT NULL,
    missing_in_ledger bigint NOT NULL,
    missing_in_bank bigint NOT NULL,
    net_difference_cents bigint NOT NULL,
    report text NOT NULL,
    token bigint NOT NULL
);
