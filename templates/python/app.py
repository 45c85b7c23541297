"""{{name}}: a Leasehold job in Python (made by `leasehold new --lang python {{name}}`).

Build it into a component and check it (README.md beside this file):

    componentize-py -d wit/job.wit -w job componentize app -o {{name}}.wasm
    leasehold check {{name}}.wasm

Each run counts the lines of ``/data/input.csv`` (``<data-dir>/{{name}}/input.csv`` on the
host), ``CHUNK`` lines per step: the count so far travels in the checkpoint, so a run resumed
on another replica carries on from the last completed step. The result is written, fenced,
under ``count/<period>``.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import log, store
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

CHUNK = 1000
INPUT = "/data/input.csv"


class WitWorld(wit_world.WitWorld):
    def describe(self) -> JobSpec:
        # Zero means "the host's default" for every limit and policy field; durations are in
        # milliseconds.
        return JobSpec(
            name="{{name}}",
            schedule="0 0 2 * * *",  # sec min hour day month weekday: 02:00:00 daily
            time_zone="UTC",
            limits=Limits(
                max_memory_bytes=0,
                max_step_millis=0,
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
        # The databases its steps open with `sql.begin` (none here): a host grants each under
        # its own name, or refuses the job, naming the one it lacks.
        return []

    def run_step(self, term, run, step, state):
        try:
            with open(INPUT) as f:
                lines = f.read().splitlines()
        except OSError as e:
            # Not there yet: the host calls this step again later.
            raise Err(JobError_NotReady(f"{INPUT}: {e.strerror}"))
        progress = json.loads(state) if state is not None else {"next": 0, "count": 0}
        start = progress["next"]
        if start >= len(lines):
            try:
                store.write(f"count/{run.period}", str(progress["count"]).encode())
            except Err as e:
                if isinstance(e.value, (WriteError_Fenced, WriteError_NotLeader)):
                    raise Err(JobError_LostLeadership())
                raise Err(JobError_Failed(f"writing the count: {e.value}"))
            log.write(log.Level.INFO, f"{run.period}: {progress['count']} lines")
            return StepOutcome_Done()
        if not term.still_leader():
            raise Err(JobError_LostLeadership())
        end = min(start + CHUNK, len(lines))
        count = progress["count"] + sum(1 for line in lines[start:end] if line.strip())
        return StepOutcome_Continue(json.dumps({"next": end, "count": count}).encode())
