"""Celery glue for the worker side: ``install`` adds MCP's tasks to a Celery app.

``run_tool(job_id)`` is a thin Celery task around ``runner.JobRunner`` (which holds everything
that is not Celery); the beat jobs call ``gc``. Here too: the worker signals (a store forgets
its connection after the fork, tools load before it, metrics are served by the main process),
the per-process inbox factory, and the start-up check of input timeouts against the broker's
redelivery limit.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from billiard.common import TERM_SIGNAL
from celery import Celery, signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.worker import state as worker_state

from mcp_celery_tasks.broker import channel
from mcp_celery_tasks.broker.beacon import BeaconListener, BeaconSender
from mcp_celery_tasks.broker.celery_app import (
    COLLECT_GARBAGE,
    OUR_APP,
    RUN_TOOL,
    SWEEP,
    beat_schedule,
    default_queue,
    load_installed_tools,
)
from mcp_celery_tasks.broker.channel import Inbox
from mcp_celery_tasks.broker.profiles import keep_emergency_dumps_out, profile_for
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings, api_only_variables, get_settings
from mcp_celery_tasks.store import WorkerStore
from mcp_celery_tasks.store.fleet import WorkerInfo
from mcp_celery_tasks.telemetry import metrics, tracing
from mcp_celery_tasks.tools.registry import all_tools, load_tool_modules
from mcp_celery_tasks.worker import claims, cuda_guard, devices, hardening
from mcp_celery_tasks.worker.child import (
    after_fork,
    catch_stop_signal,
    die_as_told,
    signal_soft_limit,
    stop_requested,
)
from mcp_celery_tasks.worker.gpu_memory import DeviceMemory
from mcp_celery_tasks.worker.limits import JobLimits
from mcp_celery_tasks.worker.observe import Telemetry
from mcp_celery_tasks.worker.presence import Presence, note_beat, unrouted_queues
from mcp_celery_tasks.worker.runner import JobRunner
from mcp_celery_tasks.worker.watchdog import RunningJob, Watchdog

__all__ = ["check_input_timeouts", "inbox_factory", "install"]

logger = logging.getLogger("mcp_celery_tasks.worker")


def inbox_factory(app: Celery) -> Callable[[], Inbox]:
    """The inbox of the calling worker process, made on first use (after the fork): one queue
    per process, ``mcp.inbox.<host>.<pid>.<random>``, with constant arguments. The random part
    keeps a reused pid (a restarted container's processes have the same ones) off an earlier
    process's queue, which may still be there, declared with other arguments by an older
    release (``channel.INBOX_EXPIRES_S``)."""
    inboxes: dict[int, Inbox] = {}

    def inbox() -> Inbox:
        pid = os.getpid()
        if pid not in inboxes:
            inboxes.clear()  # the parent's, inherited through the fork
            inboxes[pid] = Inbox(app, f"mcp.inbox.{socket.gethostname()}.{pid}.{secrets.token_hex(3)}")
        return inboxes[pid]

    return inbox


_stores: list[WorkerStore] = []
_warned_about_secrets = False


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # First of all, before any job: a GPU worker's child sees only its own device.
    devices.take_device()
    # Celery resets its own pools in the child; a psycopg connection inherited from the
    # parent must be neither used nor closed by the child.
    for store in _stores:
        store.forget_after_fork()
    after_fork()
    claims.after_fork()


@signals.worker_process_shutdown.connect
def _before_exit(**_: Any) -> None:
    devices.release_device()  # a killed child's slot is freed by its death instead


def start_watchdog(
    app: Celery,
    store: WorkerStore,
    settings: Settings,
    node: str,
    consumer: Any = None,
    beacon: BeaconListener | None = None,
) -> threading.Thread:
    """The watchdog thread of a prefork worker's main process (see ``watchdog``).

    A forced stop runs on the consumer's event loop (``hub.call_soon`` is thread-safe), which
    terminates the one request whose child is ``job.pid``: the child is killed, the message
    acknowledged and the pool replaces the process; nothing here touches the consumer's
    connection. Not Celery's revoke-by-id: its request table keeps one request per job id, the
    latest, so where a cut-off worker also received the takeover's delivery of the job it killed
    the takeover's run and let the stale one finish (issue 28); and it leaves the id revoked on
    this worker, which then drops every later delivery of the job.
    """
    hub, pool = getattr(consumer, "hub", None), getattr(consumer, "pool", None)

    def terminate(job: RunningJob) -> None:
        if hub is None or pool is None:  # no event loop to run on: the remote control's way
            app.control.revoke(job.job_id, terminate=True, signal="SIGKILL", destination=[node])
        else:
            hub.call_soon(_terminate_child, pool, job)

    if consumer is not None:
        _replace_killed_children_soon(consumer)
        if getattr(getattr(consumer, "controller", None), "max_tasks_per_child", None):
            _replace_recycled_children_soon(consumer)

    table = devices.opened_table()
    dog = Watchdog(
        store,
        settings,
        terminate=terminate,
        signal_soft_limit=signal_soft_limit,
        device_memory=DeviceMemory.of(table) if table is not None else None,
        beacon_heard_ago=beacon.heard_ago if beacon is not None else None,
    )
    board = claims.open_board()  # opened before the fork (worker_init); the children write to it
    board.start_reader()

    def loop() -> None:
        while True:
            dog.sleep_until_next_tick(settings.watchdog_interval_seconds)
            try:
                board.drain()  # every claim said so far, also those of a worker that just woke
                board.forget_the_dead()
                dog.tick(_running_jobs(board))
            except Exception:
                logger.exception("watchdog tick failed")  # the next tick tries again

    thread = threading.Thread(target=loop, name="mcp-watchdog", daemon=True)
    thread.start()
    return thread


def _terminate_child(pool: Any, job: RunningJob) -> None:
    """Kill the child ``job.pid`` that runs ``job.job_id`` (on the consumer's event loop), if it
    still does: the request's own ``terminate`` acknowledges its message, announces the revoke
    (``task_revoked``, so the pool replaces the child soon) and leaves other deliveries alone."""
    for request in list(worker_state.active_requests):
        if str(request.id) == job.job_id and request.worker_pid == job.pid:
            logger.info("terminating job %s in process %d", job.job_id, job.pid)
            request.terminate(pool, signal=signal.SIGKILL)
            return


REPLACE_AFTER_S = (0.05, 0.2, 0.5, 1.0)
"""When the pool looks again for a child it just killed, to start its replacement."""


def _replace_killed_children_soon(consumer: Any) -> None:
    """The pool replaces a child killed by a revoke (a forced stop) within a second, not up to
    its 5 s maintenance timer later: the prefork pool reaps an exited child when its sentinel
    pipe closes, which can happen just before the kernel lets it be reaped, and then only the
    timer finds it (measured: 0.2 s or 4.7 s from the kill to the next job). The revoke runs in
    the consumer's event loop, and so does this handler and the calls it schedules."""
    hub, pool = getattr(consumer, "hub", None), getattr(consumer, "pool", None)
    maintain = getattr(pool, "maintain_pool", None)
    if hub is None or maintain is None:
        return

    @signals.task_revoked.connect(weak=False)
    def _revoked(terminated: bool = False, **_: Any) -> None:
        if terminated:
            for delay in REPLACE_AFTER_S:
                hub.call_later(delay, maintain)


RECYCLE_CHECK_S = 0.1
"""How often a pool whose children retire after ``max_tasks_per_child`` jobs looks for one that did."""


def _replace_recycled_children_soon(consumer: Any) -> None:
    """A child that retired after its last job (``max_tasks_per_child``: a GPU worker's default
    is one job per child) is replaced within a tenth of a second, not at the pool's 5 s
    maintenance timer: without this, a one-job-per-child pool waited ~5 s between jobs on each
    slot (measured on tests/e2e/test_gpu_pool.py). ``maintain_pool`` only polls the children's
    exit codes (``waitpid`` with ``WNOHANG``) and starts the missing ones."""
    hub, pool = getattr(consumer, "hub", None), getattr(consumer, "pool", None)
    maintain = getattr(pool, "maintain_pool", None)
    if hub is not None and maintain is not None:
        hub.call_repeatedly(RECYCLE_CHECK_S, maintain)


def _running_jobs(board: claims.ClaimBoard) -> list[RunningJob]:
    """The ``run_tool`` jobs this worker's pool children are running now, each with the identity
    its child said it claimed the job as."""
    for _ in range(5):
        try:
            requests = list(worker_state.active_requests)
        except RuntimeError:  # the consumer thread changed the set meanwhile
            continue
        return [
            RunningJob(str(req.id), int(req.worker_pid), board.identity(int(req.worker_pid), str(req.id)))
            for req in requests
            if req.name == RUN_TOOL and req.worker_pid
        ]
    return []


def install(
    app: Celery,
    settings: Settings | None = None,
    *,
    tools: Sequence[str] | None = None,
    load_tools: bool = True,
) -> WorkerStore:
    """Make ``app`` run MCP jobs: add ``run_tool`` and the beat jobs, and load the tools.

    ``app`` may be a team's own Celery app: its broker, serializer, routes, queues and signals
    stay as they are, and its own ``celery -A proj worker`` then runs MCP jobs beside its other
    tasks (the API publishes through the same app with ``MCP_TASKS_CELERY_APP``). ``tools`` are
    the tool modules (default: ``MCP_TASKS_TOOL_MODULES``). Calling it twice changes nothing.

    Its worker should not hold the API's secrets (``MCP_TASKS_AUTH_TOKENS``,
    ``MCP_TASKS_SECRET_KEYS``, ``MCP_TASKS_JWT_PUBLIC_KEY``, ``MCP_TASKS_METRICS_TOKEN``, or their
    ``_FILE`` forms): tool code could read them from the process environment. The worker warns
    once at start when it does; start it with them unset (``env -u MCP_TASKS_AUTH_TOKENS …``).
    """
    installed: WorkerStore | None = getattr(app, "_mcp_store", None)
    if installed is not None:
        return installed
    settings = settings or get_settings()
    keep_emergency_dumps_out()
    store = WorkerStore(settings)
    app._mcp_store = store  # type: ignore[attr-defined]
    _stores.append(store)
    tracing.configure(settings, "mcp-celery-tasks-worker")
    _add_run_tool(app, JobRunner(store, settings, inbox_factory(app), observer=Telemetry()))
    _add_beat_jobs(app, store, settings)
    # The tool modules load when a worker or the API starts, not now: a project's tool module
    # usually imports its tasks module, which imports this app (and its install call).
    modules = list(settings.tool_modules if tools is None else tools) if load_tools else []
    app._mcp_tool_modules = modules  # type: ignore[attr-defined]
    _on_worker_start(app, store, settings)
    return store


def _add_run_tool(app: Celery, runner: JobRunner) -> None:
    """The ``run_tool(job_id)`` task: the runner's outcome turned into what Celery does with the
    message (acknowledge, retry later, or leave it for redelivery)."""
    main_pid = os.getpid()  # a threads or solo pool runs jobs here: no per-job signal to catch

    @app.task(
        name=RUN_TOOL,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        max_retries=None,
    )
    def run_tool(self: Any, job_id: str) -> None:
        # A cold shutdown (a deploy) ends by sending each pool child the pool's termination signal
        # (SIGTERM; SIGQUIT under REMAP_SIGTERM=SIGQUIT): the running job is given back first (not
        # an attempt), then billiard's own handler ends the child. Installed here, not at fork:
        # billiard sets its handlers after the child's initializers.
        if os.getpid() != main_pid:
            catch_stop_signal(TERM_SIGNAL)
        try:
            outcome = runner.run(job_id, dict(self.request.headers or {}))
        except Exception:
            if stop_requested():
                die_as_told()
            # A bug or an outage outside tool code: never a tool result. Retry later; the
            # claim's attempt cap turns a job that keeps failing into a failed task.
            logger.exception("job %s could not be run; retrying", job_id)
            raise self.retry(countdown=5.0, max_retries=None) from None
        if outcome.status == "stopping" or stop_requested():
            # Given back: the message must not be acknowledged (the broker redelivers it).
            die_as_told()
        if outcome.retry_in is not None:
            raise self.retry(countdown=outcome.retry_in, max_retries=None)


def _add_beat_jobs(app: Celery, store: WorkerStore, settings: Settings) -> None:
    """The garbage collector and the sweeper, and their beat schedule (merged into the app's)."""

    # Each beat job also records the beat that sent it (its ``origin``): two beats are a warning.
    @app.task(name=COLLECT_GARBAGE, ignore_result=True, bind=True)
    def collect_garbage(self: Any) -> int:
        note_beat(store, settings, self.request.origin)
        try:
            store.delete_dead_workers()
        except InfrastructureError:
            logger.info("could not delete long-dead workers' rows; the next collection will")
        return gc.collect_garbage(
            store, checkpoint_dir=settings.checkpoint_dir, artifact_dir=settings.artifact_dir
        )

    @app.task(name=SWEEP, ignore_result=True, bind=True)
    def sweep(self: Any) -> int:
        note_beat(store, settings, self.request.origin)
        return gc.sweep(
            store,
            lambda job_id, queue: channel.publish_job(app, job_id, queue),
            settings,
            queue_depth=lambda queue: channel.queue_depth(app, queue),
        )

    app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), **beat_schedule(settings)}


def _on_worker_start(app: Celery, store: WorkerStore, settings: Settings) -> None:
    """What a worker of ``app`` does as it starts: load the tools and check their input
    timeouts (before the pool forks), then watch its children and serve metrics (once ready)."""

    pinned: list[str] = []  # a GPU worker's devices, for the worker registry

    @signals.worker_init.connect(weak=False)
    def _before_start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            prefork = _pool_name(getattr(sender, "pool_cls", "prefork")) == "prefork"
            if prefork:
                # Before the pool forks, one module at a time: none may bring CUDA up here.
                try:
                    cuda_guard.load_checked(getattr(app, "_mcp_tool_modules", ()), load_tool_modules)
                except cuda_guard.CudaInParent as exc:
                    raise SystemExit(str(exc)) from None
            else:
                load_installed_tools(app)  # before the pool forks: children inherit them
            check_input_timeouts(app, settings)
            warn_about_api_secrets(os.environ)
            if settings.tool_isolation == "process" or any(t.isolation == "process" for t in all_tools()):
                hardening.undumpable()  # inherited by the pool: an isolated body cannot read our /proc
            claims.open_board()  # before the pool forks: children tell the watchdog their claims
            if settings.worker_gpus:
                pinned.extend(_pin_children(sender, settings, prefork=prefork))

    @signals.worker_ready.connect(weak=False)
    def _watch(sender: Any = None, **_: Any) -> None:
        # A prefork worker's main process watches its children; a threads pool has no process
        # to stop, and its jobs keep their leases from their own process.
        if getattr(sender, "app", None) is not app:
            return
        auto = settings.lease_self_fence == "auto"  # the maintenance worker's beacon is heard
        if isinstance(getattr(sender, "pool", None), PreforkPool):
            listener = BeaconListener(app, settings).start() if auto else None
            start_watchdog(app, store, settings, sender.hostname, sender, listener)
        if auto and settings.maintenance_queue in _consumed(sender):
            # "Postgres answers" every second: any statement it answers will do (a PK read).
            BeaconSender(app, settings, lambda: store.seconds_since_run("sweep")).start()

    presences: list[Presence] = []

    @signals.worker_ready.connect(weak=False)
    def _register(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        if pinned:
            _announce_gpus(sender)
        presence = Presence(store, settings, _snapshot(sender, pinned))
        presence.start()
        presences.append(presence)
        if app.main == OUR_APP:  # a team's own app consumes queues of its own tasks too
            _warn_unrouted(app, settings, _consumed(sender))

    @signals.worker_shutdown.connect(weak=False)
    def _deregister(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            while presences:
                presences.pop().stop()

    if settings.worker_metrics_port:
        port = settings.worker_metrics_port

        @signals.worker_ready.connect(weak=False)
        def _serve_metrics(**_: Any) -> None:
            metrics.serve_worker_metrics(port)


try:
    _VERSION = version("mcp-celery-tasks")
except PackageNotFoundError:  # running from a source tree
    _VERSION = "0.0.0"


def _consumed(consumer: Any) -> list[str]:
    return sorted(consumer.app.amqp.queues.consume_from or {})


def _snapshot(consumer: Any, devices: Sequence[str] = ()) -> Callable[[], WorkerInfo]:
    """What the worker says at each heartbeat: the pool's children change as it replaces them."""
    pool = consumer.pool
    kind = type(pool).__module__.rsplit(".", 1)[-1]  # prefork, threads, solo
    node, host, pid = str(consumer.hostname), socket.gethostname(), os.getpid()
    instance, started_at = uuid.uuid4().hex, datetime.now(UTC)

    def snapshot() -> WorkerInfo:
        try:
            children = [int(p) for p in pool.info.get("processes", ())] if kind == "prefork" else []
        except (AttributeError, TypeError, ValueError):  # the pool is starting or stopping
            children = []
        slots = int(getattr(pool, "limit", None) or consumer.app.conf.worker_concurrency or 1)
        return WorkerInfo(
            node=node, hostname=host, pid=pid, pids=children, queues=_consumed(consumer), slots=slots,
            version=_VERSION, pool=kind, instance=instance, started_at=started_at,
            devices=list(devices) if devices else None,
        )  # fmt: skip

    return snapshot


def _warn_unrouted(app: Celery, settings: Settings, consumed: Sequence[str]) -> None:
    """A queue this worker consumes that no loaded tool routes to: its slots would sit idle."""
    routed = {spec.queue or default_queue(app, settings) for spec in all_tools()}
    routed.add(settings.maintenance_queue)
    for queue in unrouted_queues(consumed, routed):
        logger.warning(
            "worker consumes queue %r, but no tool routes jobs to it (tools use: %s): check -Q",
            queue,
            ", ".join(sorted(routed)),
            extra={"event": "worker.unrouted_queue", "queue": queue},
        )


def _pool_name(pool_cls: Any) -> str:
    """``prefork``, ``threads``, ``solo`` … from a ``-P`` alias or the class Celery resolved."""
    if isinstance(pool_cls, str):
        return (
            "prefork"
            if pool_cls in ("prefork", "processes", "celery.concurrency.prefork:TaskPool")
            else pool_cls
        )
    if issubclass(pool_cls, PreforkPool):
        return "prefork"
    module = str(getattr(pool_cls, "__module__", pool_cls))
    return {"celery.concurrency.thread": "threads", "celery.concurrency.solo": "solo"}.get(module, module)


def _pin_children(worker: Any, settings: Settings, *, prefork: bool) -> tuple[str, ...]:
    """A GPU worker (``MCP_TASKS_WORKER_GPUS``): one pool child per device slot, each replaced
    child recycled after ``worker_gpu_max_tasks_per_child`` jobs, and the table of slots made
    before the pool forks (``devices``). Refuses with one line what cannot work."""
    if not prefork:
        raise SystemExit(
            "worker: a GPU worker needs the prefork pool (one process per device); "
            f"the {_pool_name(worker.pool_cls)} pool would share one CUDA context between jobs"
        )
    try:
        plan = devices.plan_devices(settings.worker_gpus or "", settings.worker_slots_per_gpu)
    except devices.DeviceError as exc:
        raise SystemExit(f"worker: {exc}") from None
    if worker.concurrency != plan.concurrency:
        logger.info(
            "GPU worker: concurrency %d (devices x slots), not %s", plan.concurrency, worker.concurrency
        )
    worker.concurrency = plan.concurrency
    if not worker.max_tasks_per_child and settings.worker_gpu_max_tasks_per_child:
        worker.max_tasks_per_child = settings.worker_gpu_max_tasks_per_child
    devices.open_table(plan)
    return tuple(plan.devices)


def _announce_gpus(consumer: Any) -> None:
    """The GPU worker's plan, logged once it is ready: at ``worker_init`` (where the children are
    pinned) Celery has not set up logging yet, and an info line there is lost."""
    table = devices.opened_table()
    if table is None:
        return
    recycle = getattr(getattr(consumer, "controller", None), "max_tasks_per_child", None)
    logger.info(
        "GPU worker: devices %s, %d slot(s) each, children recycled after %s job(s)",
        ",".join(table.plan.devices), table.plan.slots_per_gpu, recycle or "unlimited",
        extra={"event": "worker.gpus", "devices": list(table.plan.devices), "table": str(table.path)},
    )  # fmt: skip


def warn_about_api_secrets(environ: Mapping[str, str]) -> bool:
    """Warn (once per process) when a worker of ``install(app)`` holds the API's secrets.

    ``mcp-celery-tasks worker`` drops them before it starts; a team's own ``celery -A proj
    worker`` cannot: its environment is fixed at exec, ``/proc/<pid>/environ`` keeps it for the
    worker and every pool child, and tool code can read it. Returns whether it warned.
    """
    global _warned_about_secrets
    found = api_only_variables(environ)
    if not found or _warned_about_secrets:
        return False
    _warned_about_secrets = True
    logger.warning(
        "this worker's environment holds %s, which only the API uses; tool code running here can "
        "read them from /proc/self/environ. Start the worker without them, e.g. `env -u %s celery "
        "-A proj worker`, or give them to the API only (MCP_TASKS_<NAME>_FILE mounted in the API's "
        "container alone)",
        ", ".join(found),
        " -u ".join(found),
    )
    return True


def check_input_timeouts(app: Celery, settings: Settings) -> None:
    """Refuse to start when a tool may wait for input longer than the broker keeps a job.

    The broker is the app's own (``app.conf``: a team may bring its app); its profile knows the
    limit (RabbitMQ ``consumer_timeout``, Redis ``visibility_timeout`` when kombu's ack emulation
    is on; none when it is off, our default).
    """
    profile = profile_for(app.conf.broker_url)
    limit = profile.redelivery_limit(app.conf.broker_transport_options or {}, settings)
    if limit is None:
        return
    for spec in all_tools():
        waits = JobLimits.for_tool(spec, settings).resident_wait_s
        if waits >= limit.seconds:
            raise SystemExit(
                f"tool {spec.name!r} may wait {waits:.0f} s for input holding its worker, but the "
                f"{limit.name} is {limit.seconds:.0f} s: let it suspend sooner (suspend_after), "
                "lower the input timeout, or raise the broker's limit (and its MCP_TASKS_ setting)"
            )
