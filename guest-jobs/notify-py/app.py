"""Daily settlement notice, written in Python: a Leasehold job that calls an HTTP service.

Each period it sends one ``POST`` to the partner endpoint named in ``<data-dir>/notify/endpoint``
(granted in its sidecar's ``[http] allow``) with an ``Idempotency-Key`` of the period, through
``wasi:http``: the host opens the connection, only to a granted destination, and adds the job,
the period and the term's token as headers this code cannot set. A fenced partner answers a
replaced leader ``409 Conflict``: the step ends as lost leadership, like a fenced store write.
The partner's answer is recorded with ``store.write`` under ``notified/<period>``.

The world is ``http-job`` (``wit/world.wit``: Leasehold's ``job`` world and
``wasi:http/outgoing-handler``), so the job's types are in ``wit_world.imports.leasehold_job_types``
and the HTTP types in ``wit_world.imports.wasi_http_types``.
"""

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler, store
from wit_world.imports import wasi_http_types as http
from wit_world.imports.leasehold_job_types import (
    CatchUp,
    JobError_Failed,
    JobError_LostLeadership,
    JobError_NotReady,
    JobSpec,
    Limits,
    Overlap,
    Policies,
    StepOutcome_Done,
)
from wit_world.imports.store import WriteError_Fenced, WriteError_NotLeader
from wit_world.imports.streams import StreamError_Closed

ENDPOINT = "/data/endpoint"


class HttpError(Exception):
    """A request that got no response: ``code`` is the wasi:http error code (a dataclass whose
    name says what happened, e.g. ``ErrorCode_HttpRequestDenied``)."""

    def __init__(self, code):
        super().__init__(type(code).__name__.removeprefix("ErrorCode_"))
        self.code = code


def wait(pending):
    """The pending response's result once it is ready (``Ok`` of ``Ok(response)`` or
    ``Err(code)``), or None when it was already taken."""
    with pending.subscribe() as ready:
        ready.block()
    got = pending.get()
    if got is None or isinstance(got, Err):
        return None
    return got


def send(method, url, headers, body):
    """One request through the host; (status, body bytes), or raises HttpError."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    request = http.OutgoingRequest(
        http.Fields.from_list([(k, v.encode()) for k, v in headers]))
    request.set_method(method)
    request.set_scheme(http.Scheme_Https() if scheme == "https" else http.Scheme_Http())
    request.set_authority(authority)
    request.set_path_with_query(slash + path if slash else "/")
    outgoing = request.body()
    try:
        pending = outgoing_handler.handle(request, None)
    except Err as e:
        raise HttpError(e.value)
    try:
        with outgoing.write() as stream:
            stream.blocking_write_and_flush(body)
        http.OutgoingBody.finish(outgoing, None)
    except Err as e:
        # The host refused or cut the request while the body was being written (a refusal is
        # decided once the request is sent, so the body's stream may already be closed): the
        # reason is the pending response's error.
        got = wait(pending)
        if got is not None and isinstance(got.value, Err):
            raise HttpError(got.value.value)
        raise Err(JobError_Failed(f"writing the request body: {e.value}"))
    got = wait(pending)
    if isinstance(got.value, Err):
        raise HttpError(got.value.value)
    response = got.value.value
    status = response.status()
    received = b""
    with response.consume() as incoming:
        with incoming.stream() as stream:
            while True:
                try:
                    received += stream.blocking_read(65536)
                except Err as e:
                    if isinstance(e.value, StreamError_Closed):
                        break
                    raise Err(JobError_Failed(f"reading the response: {e.value}"))
    return status, received


class WitWorld(wit_world.WitWorld):
    def describe(self) -> JobSpec:
        return JobSpec(
            name="notify",
            schedule="0 30 4 * * *",
            time_zone="UTC",
            limits=Limits(
                max_memory_bytes=0,
                max_step_millis=30_000,
                max_write_bytes=0,
                max_stored_keys=0,
                max_stored_bytes=0,
            ),
            policies=Policies(
                catch_up=CatchUp.LATEST,
                catch_up_window_millis=0,
                retry_attempts=3,
                retry_backoff_millis=1_000,
                retry_max_backoff_millis=10_000,
                overlap=Overlap.QUEUE,
                max_run_millis=0,
            ),
        )

    def databases(self) -> list[str]:
        return []

    def run_step(self, term, run, step, state):
        try:
            with open(ENDPOINT) as f:
                url = f.read().strip()
        except OSError as e:
            raise Err(JobError_NotReady(f"{ENDPOINT}: {e.strerror}"))
        if not term.still_leader():
            raise Err(JobError_LostLeadership())
        notice = f'{{"period":"{run.period}","kind":"settlement-ready"}}'
        try:
            status, body = send(
                http.Method_Post(),
                url,
                [("idempotency-key", run.period), ("content-type", "application/json")],
                notice.encode(),
            )
        except HttpError as e:
            # The host refuses requests once the term's deadline has passed.
            if not term.still_leader():
                raise Err(JobError_LostLeadership())
            raise Err(JobError_Failed(f"notifying {url}: {e}"))
        if status == 409:
            raise Err(JobError_LostLeadership())
        if not 200 <= status < 300:
            raise Err(JobError_Failed(f"{url} answered {status}: {body[:200]!r}"))
        try:
            store.write(f"notified/{run.period}", f"{status} token={term.token()}".encode())
        except Err as e:
            if isinstance(e.value, (WriteError_Fenced, WriteError_NotLeader)):
                raise Err(JobError_LostLeadership())
            raise Err(JobError_Failed(f"recording the notice: {e.value}"))
        return StepOutcome_Done()
