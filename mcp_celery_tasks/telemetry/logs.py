"""Logging: readable lines on a terminal, one JSON object per line everywhere else.

Records carry their context in ``extra`` (``event``, ``job_id``, ``tool``, ``queue``, ``attempt``,
``worker``, ``duration_s``, ``method``, ``code``, ``latency_ms``). Task ids and arguments are
never logged: a task id is a bearer-like handle; the job id identifies a job in logs, Flower
and ``mcp-celery-tasks tasks show``.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {  # a record's extras may be any object: dumped with str()
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "info", *, json_logs: bool | None = None) -> None:
    """Root logging for our processes: JSON unless stderr is a terminal (or forced)."""
    use_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    handler = logging.StreamHandler(sys.stderr)
    if use_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
