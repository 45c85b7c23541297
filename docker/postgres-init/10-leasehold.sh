#!/bin/sh
# Run once by the PostgreSQL container's first start (as POSTGRES_USER, in POSTGRES_DB): the
# role the leasehold replicas log in as for jobs, the billing sample's ledger table, which that
# role may read and append to, and the reconciliation's reports table, which it may upsert. `leasehold db init` (the compose file's db-init service)
# then adds the fence; it keeps the role's password.
set -eu
psql -v ON_ERROR_STOP=1 -q -U "$POSTGRES_USER" -d "$POSTGRES_DB" -v pw="$LEASEHOLD_PG_PASSWORD" <<'SQL'
CREATE ROLE leasehold LOGIN PASSWORD :'pw';
\i /leasehold/billing-ledger.sql
GRANT SELECT, INSERT ON billing_charges TO leasehold;
\i /leasehold/reconciliation-reports.sql
GRANT SELECT, INSERT, UPDATE ON reconciliation_reports TO leasehold;
SQL
