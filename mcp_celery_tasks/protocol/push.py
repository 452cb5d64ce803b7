"""``subscriptions/listen`` for task notifications: push instead of polling.

The stream acknowledges the task ids the caller may see, then sends ``notifications/tasks``
(the full DetailedTask, as tasks/get would return it at that moment) whenever a task changes,
and ends with the subscription's final result once every task is terminal. Changes come from
the TaskEvents hub (LISTEN on status transitions, so any API replica sees any worker's
change) plus its batched re-read for statusMessage updates, which send no NOTIFY: an idle
stream reads nothing itself. A subscriber holds only the last state it sent per task: memory
is bounded, and a slow client only slows its own stream (notifications coalesce to the latest
state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from datetime import datetime

from mcp_celery_tasks.errors import InvalidParams, InvalidRequest
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import Status
from mcp_celery_tasks.protocol.holds import streamed
from mcp_celery_tasks.protocol.rpc import Result, Stream, result_body
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import Message, Notification, RequestId, ResultResponse
from mcp_celery_tasks.protocol.v2026_07_28 import detailed
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.wire import ListenParams, dump

__all__ = ["SUBSCRIPTION_ID", "listen"]

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


async def listen(services: Services, ctx: RequestContext, params: ListenParams) -> Result:
    request_id = ctx.request_id
    requested = params.notifications.task_ids if params.notifications else None
    if requested is None:
        # Only task notifications are offered: agree to nothing (the ack omits taskIds) and
        # end the subscription at once (SPEC-CHECKLIST Q-21).
        return Stream(_nothing(services, request_id))
    ctx.require_tasks()  # SEP-2663: taskIds from a non-declaring client -> -32021
    limit = services.settings.max_subscription_task_ids
    if len(requested) > limit:
        raise InvalidParams(f"At most {limit} taskIds per subscription")
    # The slot is taken here, with no await between the check and the count: 120 listens that
    # all passed the check before any of them started streaming once opened 120 against 32.
    slot = _Slot(services, ctx.principal)
    try:
        # A stream among the principal's open streams too (synchronous calls relayed on SSE).
        hold = services.holds.take(ctx.principal, stream=services.settings.max_open_streams_per_principal)
    except BaseException:
        slot.release()
        raise
    try:
        unique = list(dict.fromkeys(requested))
        # Only ids that exist and belong to the caller are acknowledged (SPEC-CHECKLIST Q-21):
        # a foreign id is treated exactly like an unknown one.
        owned = {record.task_id for record in await services.tasks.owned(unique, ctx.principal)}
    except BaseException:
        slot.release()
        hold.release()
        raise
    accepted = [task_id for task_id in unique if task_id in owned]
    messages = _counted(slot, _messages(services, ctx.principal, request_id, accepted))
    return Stream(streamed(hold, messages))


class _Slot:
    """One of a principal's ``max_subscriptions_per_principal`` open streams, taken at once.

    Released when its stream ends, and also when a stream that never started is dropped (the
    client left before the response began: the generator's ``finally`` never runs, but the
    generator and this slot are collected with the request)."""

    def __init__(self, services: Services, principal: str) -> None:
        self._services = services
        self._principal = principal
        self._held = False
        cap = services.settings.max_subscriptions_per_principal
        if services.subscriptions.get(principal, 0) >= cap:
            raise InvalidRequest(f"At most {cap} open subscriptions")
        services.subscriptions[principal] = services.subscriptions.get(principal, 0) + 1
        self._held = True
        metrics.hub_subscribers.inc()

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        metrics.hub_subscribers.dec()
        subscriptions = self._services.subscriptions
        left = subscriptions.get(self._principal, 1) - 1
        if left > 0:
            subscriptions[self._principal] = left
        else:
            subscriptions.pop(self._principal, None)

    def __del__(self) -> None:
        self.release()


async def _counted(slot: _Slot, messages: AsyncIterator[Message]) -> AsyncIterator[Message]:
    try:
        async for message in messages:
            yield message
    finally:
        slot.release()


async def _nothing(services: Services, request_id: RequestId | None) -> AsyncIterator[Message]:
    yield _notification("notifications/subscriptions/acknowledged", request_id, {"notifications": {}})
    yield _final(services, request_id)


def _final(services: Services, request_id: RequestId | None) -> ResultResponse:
    """The subscription's own response, last on the stream (with serverInfo, as every result)."""
    result: JSONObject = {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: request_id}}
    return result_body(request_id, result, services.server_info)


def _notification(method: str, request_id: RequestId | None, body: JSONObject) -> Notification:
    """A notification of the subscription: ``body`` (its ``_meta`` taken out of it) as params,
    after a ``_meta`` naming the subscription."""
    given = body.pop("_meta", None) or {}
    if not isinstance(given, Mapping):
        raise TypeError(f"a notification's _meta must be an object, not {type(given).__name__}")
    meta: JSONObject = {**given, SUBSCRIPTION_ID: request_id}
    return {"jsonrpc": "2.0", "method": method, "params": {"_meta": meta, **body}}


async def _messages(
    services: Services, principal: str, request_id: RequestId | None, task_ids: list[str]
) -> AsyncIterator[Message]:
    # The acknowledgement MUST be the first message, listing only what we agreed to.
    ack: JSONObject = {"notifications": {"taskIds": [*task_ids]}}
    yield _notification("notifications/subscriptions/acknowledged", request_id, ack)
    sent: dict[str, tuple[Status, str | None, datetime]] = {}
    pending = set(task_ids)
    changed = asyncio.Event()
    with contextlib.ExitStack() as watches:
        for task_id in task_ids:
            watches.enter_context(services.tasks.watching(task_id, changed))
        while pending:
            changed.clear()
            records = await services.tasks.owned(pending, principal)
            pending &= {record.task_id for record in records}  # a task collected meanwhile ends its part
            for record in records:
                state = (record.status, record.status_message, record.last_updated_at)
                if sent.get(record.task_id) == state:
                    continue
                sent[record.task_id] = state
                shown = dump(detailed(await services.tasks.view(record)))
                shown.pop("resultType", None)  # a notification, not a result
                yield _notification("notifications/tasks", request_id, shown)
                if not record.active:
                    pending.discard(record.task_id)
            if pending:
                # No timer of our own: the hub re-reads every subscribed task's state in one batch
                # per poll (statusMessage sends no NOTIFY), and wakes everyone after a reconnect.
                # A re-read per stream every few seconds was half of an idle API's CPU with 1 000
                # subscriptions open (docs/PERFORMANCE.md).
                await changed.wait()
    yield _final(services, request_id)
