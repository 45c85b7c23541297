"""Daily settlement export, written in Python: a Leasehold job built with componentize-py.

Inputs (read-only, ``<data-dir>/settlement/``): ``payments.csv`` with a header and one
``payment_id,merchant,amount_cents`` line per captured payment; optionally ``delay-ms``, a pause
per payment that stands in for a slow ledger (tests use it to kill a leader mid-run).

Each step settles the next ``CHUNK`` payments into per-merchant totals, which travel in the
checkpoint (JSON), so a run resumed on another replica carries on where the last completed
step stopped. The last step records one payout per merchant, never twice when it is
re-executed: in PostgreSQL when the host grants the job a database named ``ledger`` (sidecar
``[sql.databases] ledger = "..."``): rows of ``settlement_payouts`` (``ledger.sql`` beside this
file), all in one transaction the database fences with the term's token, inserted with
``ON CONFLICT DO NOTHING``; otherwise with ``store.create`` under the idempotency key
``payout/<period>/<merchant>``. Then it writes the export ``export/<period>`` with
``store.write``.

A line that does not parse raises ``ValueError``: uncaught, it fails the step, and the
traceback's last lines are in the run's record (``leasehold runs settlement``).
"""

import csv
import json
import time

import wit_world
from componentize_py_types import Err
from wit_world.imports import log, sql, store
from wit_world.imports.sql import (
    SqlError_Fenced,
    SqlError_NotGranted,
    SqlError_NotLeader,
    Value_Int,
    Value_Text,
)
from wit_world.imports.store import WriteError_Fenced, WriteError_NotLeader
from wit_world.imports.types import (
    CatchUp,
    JobError_Failed,
    JobError_LostLeadership,
    JobError_NotReady,
    JobSpec,
    Limits,
    Overlap,
    Policies,
    StepOutcome_Continue,
    StepOutcome_Done,
)

# Payments per step.
CHUNK = 25
PAYMENTS = "/data/payments.csv"


def lost_leadership():
    return Err(JobError_LostLeadership())


def read_payments():
    """The payments in file order: (payment_id, merchant, amount_cents)."""
    try:
        with open(PAYMENTS, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise Err(JobError_NotReady(f"{PAYMENTS}: {e.strerror}"))
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3:
            raise Err(JobError_Failed(
                f"payments.csv line {number}: expected payment_id,merchant,amount_cents"))
        payment, merchant, amount = (field.strip() for field in row)
        # Deliberately not caught: a bad amount is an exception whose traceback is recorded.
        out.append((payment, merchant, int(amount)))
    return out


def delay():
    try:
        with open("/data/delay-ms") as f:
            return int(f.read().strip()) / 1000.0
    except OSError:
        return 0.0


def write(key, value):
    """A fenced write; a refusal because another replica leads ends the step."""
    try:
        store.write(key, value)
    except Err as e:
        if isinstance(e.value, (WriteError_Fenced, WriteError_NotLeader)):
            raise lost_leadership()
        raise Err(JobError_Failed(f"writing {key}: {e.value}"))


def create(key, value):
    """A fenced write-if-absent: True if this call created the key."""
    try:
        return store.create(key, value)
    except Err as e:
        if isinstance(e.value, (WriteError_Fenced, WriteError_NotLeader)):
            raise lost_leadership()
        raise Err(JobError_Failed(f"recording {key}: {e.value}"))


def book_in_ledger(term, run, totals):
    """Books every payout in the ``ledger`` database in one fenced transaction: the number of
    new rows, or None when the host grants no such database."""
    try:
        tx = sql.begin("ledger")
    except Err as e:
        if isinstance(e.value, SqlError_NotGranted):
            return None
        raise sql_error("opening the ledger", e)
    created = 0
    try:
        for merchant in sorted(totals):
            created += tx.execute(
                "INSERT INTO settlement_payouts (period, merchant, amount_cents, token) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (period, merchant) DO NOTHING",
                [Value_Text(run.period), Value_Text(merchant), Value_Int(totals[merchant]),
                 Value_Int(term.token())])
        sql.Transaction.commit(tx)
    except Err as e:
        raise sql_error("booking the payouts", e)
    return created


def sql_error(doing, e):
    """A failed sql call as the step's error: a newer term ends the step, anything else fails
    the attempt (a lost COMMIT reply included: the retry's ON CONFLICT finds what landed)."""
    if isinstance(e.value, (SqlError_Fenced, SqlError_NotLeader)):
        return lost_leadership()
    return Err(JobError_Failed(f"{doing}: {e.value}"))


class WitWorld(wit_world.WitWorld):
    def describe(self) -> JobSpec:
        return JobSpec(
            name="settlement",
            schedule="0 0 4 * * *",
            time_zone="UTC",
            limits=Limits(
                max_memory_bytes=0,
                max_step_millis=60_000,
                max_write_bytes=0,
                max_stored_keys=0,
                max_stored_bytes=0,
            ),
            policies=Policies(
                catch_up=CatchUp.LATEST,
                catch_up_window_millis=0,
                retry_attempts=0,
                retry_backoff_millis=0,
                retry_max_backoff_millis=0,
                overlap=Overlap.QUEUE,
                max_run_millis=0,
            ),
        )

    def databases(self) -> list[str]:
        # None declared: the ledger is optional (granted by the sidecar's [sql.databases]);
        # declared, a host without it would refuse the job.
        return []

    def run_step(self, term, run, step, state):
        payments = read_payments()
        progress = json.loads(state) if state is not None else {"next": 0, "totals": {}}
        start = progress["next"]
        if start >= len(payments):
            return self.finish(term, run, progress["totals"], len(payments))
        pause = delay()
        end = min(start + CHUNK, len(payments))
        totals = progress["totals"]
        for _payment, merchant, amount in payments[start:end]:
            if not term.still_leader():
                raise lost_leadership()
            if pause:
                time.sleep(pause)
            totals[merchant] = totals.get(merchant, 0) + amount
        log.write(log.Level.INFO, f"settled payments {start}..{end} of {len(payments)}")
        progress = {"next": end, "totals": totals}
        return StepOutcome_Continue(json.dumps(progress, sort_keys=True).encode())

    def finish(self, term, run, totals, count):
        created = book_in_ledger(term, run, totals)
        if created is None:
            created = 0
            for merchant in sorted(totals):
                key = f"payout/{run.period}/{merchant}"
                value = f"{totals[merchant]} token={term.token()} attempt={run.attempt}"
                if create(key, value.encode()):
                    created += 1
        lines = [f"settlement {run.period}: {count} payments, {len(totals)} merchants"]
        lines += [f"{merchant} {totals[merchant]}" for merchant in sorted(totals)]
        lines.append(f"total {sum(totals.values())}")
        write(f"export/{run.period}", ("\n".join(lines) + "\n").encode())
        log.write(log.Level.INFO, f"settlement {run.period}: {created} payouts recorded")
        return StepOutcome_Done()
