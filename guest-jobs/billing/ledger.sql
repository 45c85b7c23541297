-- The table the billing sample books its charges in, when the host grants it a database named
-- `ledger`: one row per customer and period, with the token of the term that booked it.
-- Created by the operator (the job's role may not create tables); run once, after
-- `leasehold db init`, and grant the job's role what the job does with it:
--   GRANT SELECT, INSERT ON billing_charges TO <role>;
CREATE TABLE IF NOT EXISTS billing_charges (
    period text NOT NULL,
    customer text NOT NULL,
    amount_cents bigint NOT NULL,
    token bigint NOT NULL,
    attempt integer NOT NULL,
    UNIQUE (period, customer)
);
