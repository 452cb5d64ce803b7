"""TaskEvents: one hub per API process that tells waiters when a task may have changed.

One LISTEN connection per process (``NOTIFY mcp_task_events`` is sent by status transitions
only), fanned out in-process. A notification is a hint: the waiter re-reads its row. Waiting
costs nothing per waiter: a waiter reads its row when woken, never on a timer. What a lost
notification could hide, the hub finds itself, for every waiter at once: after a reconnect it
wakes everyone, and every ``safety_s`` it re-reads all watched tasks in one batched query and
wakes those that changed. Tasks that also want statusMessage, progress or log changes (which
send no NOTIFY: push subscriptions, synchronous calls that relay progress or logs) are re-read
the same way every ``poll_s``.

A create sends no NOTIFY (one per create would serialize the creates' commits on the
notification queue and wake every replica's fair publisher). Who wants to hear of new tasks (the
console's live list) watches ``any_change``: it is set by this process's creates
(``announce_created``), by every NOTIFY of any task, and after a reconnect.

A NOTIFY whose payload is a registered signal (``on_signal``: the console's revocations) is no
task's: it calls that signal's callbacks and wakes nobody else; so does every reconnect, since a
signal may have been missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.store import ApiStore, TaskRecord

__all__ = ["TaskEvents"]

logger = logging.getLogger("mcp_celery_tasks.events")

_BATCH = 1000
"""Task ids per batched re-read."""


class TaskEvents:
    def __init__(self, store: ApiStore, *, safety_s: float = 5.0, poll_s: float = 0.25) -> None:
        self._store = store
        self._safety_s = safety_s
        self._poll_s = poll_s
        self._polled: dict[str, int] = {}
        self._last_seen: dict[str, list[object]] = {}
        """Per watched task: status, statusMessage, lastUpdatedAt, log count and finishedAt at the
        last re-read."""
        self._poller: asyncio.Task[None] | None = None
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._any: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None
        self._on_notify: list[Callable[[], object]] = []
        self._signals: dict[str, list[Callable[[], object]]] = {}
        self.connected = False
        self.rereads = 0
        """Batched re-read queries so far (tests and benchmarks count them)."""

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="mcp-task-events")
        self._poller = asyncio.create_task(self._poll(), name="mcp-task-poller")

    async def stop(self) -> None:
        for task in (self._poller, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def on_notify(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (thread-safe, quick) on every status transition of any task, and
        after a reconnect (the fair publisher: a slot may be free)."""
        self._on_notify.append(callback)

    def on_signal(self, payload: str, callback: Callable[[], object]) -> None:
        """Call ``callback`` (quick, in the event loop) on every ``NOTIFY`` of ``payload`` (which
        must be no task id) and after every reconnect."""
        self._signals.setdefault(payload, []).append(callback)

    @property
    def watched(self) -> int:
        return len(self._watchers)

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever ``task_id`` may have changed."""
        with self.watch_with(task_id, asyncio.Event()) as event:
            yield event

    @contextlib.contextmanager
    def polled(self, task_id: str) -> Iterator[None]:
        """Also notice changes that send no NOTIFY (statusMessage): one batched re-read of every
        polled task per ``poll_s`` for the whole process, however many subscribers there are."""
        self._polled[task_id] = self._polled.get(task_id, 0) + 1
        try:
            yield
        finally:
            left = self._polled.get(task_id, 1) - 1
            if left:
                self._polled[task_id] = left
            else:
                self._polled.pop(task_id, None)
                self._forget(task_id)

    @contextlib.contextmanager
    def watch_with(self, task_id: str, event: asyncio.Event) -> Iterator[asyncio.Event]:
        """Set ``event`` whenever ``task_id`` may have changed (one event may watch many tasks)."""
        self._watchers.setdefault(task_id, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._watchers.get(task_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._watchers[task_id]
                    self._forget(task_id)

    @contextlib.contextmanager
    def any_change(self, event: asyncio.Event) -> Iterator[asyncio.Event]:
        """Set ``event`` when a task may have been created or changed anywhere: on this process's
        creates and on every NOTIFY (a task created through another replica shows up with its
        own first transition, or with any other task's)."""
        self._any.add(event)
        try:
            yield event
        finally:
            self._any.discard(event)

    def announce_created(self) -> None:
        """A task was created by this process (``TaskService.create``)."""
        self._wake_any()

    def _wake_any(self) -> None:
        for event in self._any:
            event.set()

    def _forget(self, task_id: str) -> None:
        if task_id not in self._watchers and task_id not in self._polled:
            self._last_seen.pop(task_id, None)

    async def wait_for(
        self,
        task_id: str,
        owner: str,
        wait_s: float,
        until: Callable[[TaskRecord], bool] = lambda record: not record.active,
    ) -> TaskRecord | None:
        """The row once ``until(row)`` holds (by default: terminal), or the last row read when
        ``wait_s`` runs out. None if the task does not exist for ``owner``. The row is read once,
        then again only when the hub says it may have changed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        with self.watch(task_id) as changed:
            while True:
                changed.clear()  # before the read: a change after it wakes us
                record = await self._store.get_task(task_id, owner)
                if record is None or until(record):
                    return record
                left = deadline - loop.time()
                if left <= 0:
                    return record
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=left)

    # ---- the hub's own reads -------------------------------------------------------------------

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self._safety_s
        while True:
            await asyncio.sleep(self._poll_s)
            due = set(self._polled)
            if loop.time() >= next_sweep:
                due.update(self._watchers)
                next_sweep = loop.time() + self._safety_s
            if due:
                try:
                    await self._reread(sorted(due))
                except Exception:
                    # Waiters and push streams have no timer of their own: the poller must live.
                    logger.exception("the task event hub's re-read failed; trying again next poll")

    async def _reread(self, task_ids: list[str]) -> None:
        """Re-read ``task_ids`` in batches; wake whoever watches one that changed (or that is
        seen for the first time: its waiter may have read it before a notification was lost)."""
        for start in range(0, len(task_ids), _BATCH):
            chunk = task_ids[start : start + _BATCH]
            try:
                rows = await self._store.task_states(chunk)
            except InfrastructureError:
                return  # the listener's reconnect wakes everyone anyway
            self.rereads += 1
            found = set()
            for task_id, *state in rows:
                found.add(task_id)
                if self._last_seen.get(task_id) != state:
                    self._last_seen[task_id] = state
                    self._wake(task_id)
            for gone in set(chunk) - found:  # collected meanwhile: let its waiters find out
                if self._last_seen.pop(gone, None) is not None or gone in self._watchers:
                    self._wake(gone)

    def _wake(self, task_id: str | None) -> None:
        if task_id is None:
            for waiters in self._watchers.values():
                for event in waiters:
                    event.set()
            return
        for event in self._watchers.get(task_id, ()):
            event.set()

    def _signalled(self, payload: str | None) -> bool:
        """Run a signal's callbacks (every signal's after a reconnect, ``None``); whether the
        payload was a signal rather than a task id."""
        if payload is None:
            callbacks = [callback for each in self._signals.values() for callback in each]
        else:
            callbacks = self._signals.get(payload, [])
        for callback in callbacks:
            callback()
        return payload is not None and bool(callbacks)

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                async for task_id in self._store.notifications():
                    self.connected = True
                    backoff = 0.1
                    if self._signalled(task_id):
                        continue
                    self._wake(task_id)
                    self._wake_any()  # a NOTIFY, or a reconnect: a new task may be there too
                    for callback in self._on_notify:
                        callback()
            except InfrastructureError:
                logger.warning("task event listener lost its connection; reconnecting", exc_info=True)
            self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
