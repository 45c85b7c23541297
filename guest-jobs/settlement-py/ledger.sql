-- The table the Python settlement sample books its payouts in, when the host grants it a
-- database named `ledger`: one row per merchant and period, with the token of the term that
-- booked it. Created by the operator, after `leasehold db init`; grant the job's role:
--   GRANT SELECT, INSERT ON settlement_payouts TO <role>;
CREATE TABLE IF NOT EXISTS settlement_payouts (
    period text NOT NULL,
    merchant text NOT NULL,
    amount_cents bigint NOT NULL,
    token bigint NOT NULL,
    UNIQUE (period, merchant)
);
