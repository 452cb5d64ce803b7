"""Progress and log notifications of a synchronous tools/call, from what its job reports.

The job's ``ctx.report(message, progress, total)`` lands on its row (coalesced by the worker)
and ``ctx.log(...)`` in ``mcp_task_logs`` (only when the caller asked for that level). Neither
sends a NOTIFY: while a synchronous call relays them, the event hub re-reads its row with every
other polled task, once per ``poll_s`` for the whole process. Tasks never get these
notifications (SEP-2663 S-53: "not supported on tasks"; their progress is ``statusMessage``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import LogMessageParams, Notification, ProgressParams
from mcp_celery_tasks.store import TaskRecord

__all__ = ["Relay"]


def _number(value: float) -> float | int:
    return int(value) if value.is_integer() else value


@dataclass
class Relay:
    """What one synchronous call relays, and how far it got."""

    progress_token: str | int | None
    logs: bool
    sent_progress: float | None = None
    sent_message: str | None = None
    sent_logs: int = 0

    @property
    def wanted(self) -> bool:
        return self.progress_token is not None or self.logs

    def news(self, record: TaskRecord) -> bool:
        """Whether the row holds something not relayed yet."""
        return self._next_progress(record) is not None or (self.logs and record.log_seq > self.sent_logs)

    def _next_progress(self, record: TaskRecord) -> float | None:
        """The ``progress`` of the next notification, or None when there is nothing new.

        Progress MUST increase with each notification (basic/utilities/progress). A job that
        reports numbers sends them as they rise. A job that reports only messages
        (``ctx.report("loading")``) still reaches a caller that asked for progress: each new
        message goes with a counter one above the last value sent, and no ``total``. Once the job
        reports a number, messages ride along with the next rise of that number.
        """
        if self.progress_token is None:
            return None
        if record.progress is not None:
            rises = self.sent_progress is None or record.progress > self.sent_progress
            return record.progress if rises else None
        message = record.status_message
        if record.active and message and message != self.sent_message:
            return float(self.sent_progress or 0) + 1
        return None

    async def notifications(self, services: Services, record: TaskRecord) -> list[Notification]:
        """The notifications for what ``record`` holds beyond what was sent (logs first: they
        were written before the report that follows them)."""
        messages: list[Notification] = []
        while self.logs and record.log_seq > self.sent_logs:
            batch = await services.tasks.logs_after(record.task_id, self.sent_logs)
            if not batch:
                break
            for entry in batch:
                self.sent_logs = entry.seq
                params: LogMessageParams = {"level": entry.level, "data": entry.data}
                if entry.logger:
                    params["logger"] = entry.logger
                messages.append({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
        token = self.progress_token
        value = self._next_progress(record)
        if value is not None:
            assert token is not None  # what _next_progress checked
            self.sent_progress, self.sent_message = value, record.status_message
            progress: ProgressParams = {"progressToken": token, "progress": _number(value)}
            if record.progress is not None and record.progress_total is not None:
                progress["total"] = _number(record.progress_total)
            if record.status_message and record.active:
                progress["message"] = record.status_message
            messages.append({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
        return messages
