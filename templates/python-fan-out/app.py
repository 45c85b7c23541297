"""{{name}}: a Leasehold fan-out job in Python (made by `leasehold new --lang python --fan-out
{{name}}`).

Build it into a component and check it (README.md beside this file):

    componentize-py -d wit/job.wit -w fan-out-job componentize app -o {{name}}.wasm
    leasehold check {{name}}.wasm

Each run counts the non-blank lines of ``/data/input.csv`` (``<data-dir>/{{name}}/input.csv``
on the host) with ``PARTS`` tasks, which every replica of the cluster runs (the leader too):
step 0 submits one task per slice of the file and waits for them
(``StepOutcome_AwaitTasks``); ``run_task`` counts its slice and returns the count; step 1
reads every task's output and writes the total, fenced, under ``count/<period>``. A task's
writes are fenced like a step's, and a task whose worker dies is run again elsewhere, so it
must be idempotent: here it only returns its output.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import log, store, tasks
from wit_world.imports.store import WriteError_Fenced, WriteError_NotLeader
from wit_world.imports.tasks import Task, TasksError_Fenced, TasksError_NotLeader
from wit_world.imports.types import (
    CatchUp,
    JobError_Failed,
    JobError_LostLeadership,
    JobError_NotReady,
    JobSpec,
    Limits,
    Overlap,
    Policies,
    StepOutcome_AwaitTasks,
    StepOutcome_Done,
)

PARTS = 10
INPUT = "/data/input.csv"


def read_lines():
    try:
        with open(INPUT) as f:
            return f.read().splitlines()
    except OSError as e:
        # Not there yet: the host calls this step again later.
        raise Err(JobError_NotReady(f"{INPUT}: {e.strerror}"))


def lost_or_failed(doing, e):
    """A refused call as the step's error: a newer term ends the step, the rest fail it."""
    if isinstance(e.value, (TasksError_Fenced, TasksError_NotLeader, WriteError_Fenced,
                            WriteError_NotLeader)):
        return Err(JobError_LostLeadership())
    return Err(JobError_Failed(f"{doing}: {e.value}"))


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
        if step == 0:
            lines = read_lines()
            size = -(-len(lines) // PARTS)  # ceiling division
            work = [
                Task(id=f"part-{i}", payload=json.dumps(
                    {"first": i * size, "last": min((i + 1) * size, len(lines))}).encode())
                for i in range(PARTS)
            ]
            try:
                # Submitting the same ids again (a re-executed step) is safe.
                tasks.submit(work)
            except Err as e:
                raise lost_or_failed("submitting the tasks", e)
            return StepOutcome_AwaitTasks(b"")
        total = 0
        for i in range(PARTS):
            try:
                out = tasks.output(f"part-{i}")
            except Err as e:
                raise lost_or_failed(f"reading part-{i}", e)
            if out is None:
                raise Err(JobError_Failed(f"part-{i} has no output"))
            total += int(out)
        try:
            store.write(f"count/{run.period}", str(total).encode())
        except Err as e:
            raise lost_or_failed("writing the count", e)
        log.write(log.Level.INFO, f"{run.period}: {total} lines in {PARTS} parts")
        return StepOutcome_Done()

    def run_task(self, term, run, task):
        part = json.loads(task.payload)
        lines = read_lines()[part["first"]:part["last"]]
        return str(sum(1 for line in lines if line.strip())).encode()
