"""The task list's filters as URL query parameters, so a saved filter is a URL.

``?status=failed&tool=train&owner=token:alice&queue=gpu&since=2026-12-03T10:00&until=…&job=ab12``
and the keyset cursor ``before=<created_at ISO>~<job_id>`` (the last row of the page shown; the
live list's ``after=`` is the first row's, for rows newer than it). ``sort=finished`` orders by
finish time instead (finished tasks only), its cursors ``finished~<finished_at ISO>~<job_id>``;
``order=oldest`` reverses either sort. An unknown status or sort, an unreadable time or a cursor
of another sort is a ``BadFilter`` (HTTP 400), never ignored: a filter that silently widened
would show an admin the wrong tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

from mcp_celery_tasks.store.console_calls import TaskFilter
from mcp_celery_tasks.store.console_queries import STATUS_FILTERS

__all__ = [
    "FIELDS",
    "FILTERS",
    "PAGE_ROWS",
    "SORTS",
    "STATUSES",
    "BadFilter",
    "cursor",
    "filter_fields",
    "oldest",
    "page_size",
    "parse",
    "query",
    "sort_links",
]

STATUSES = tuple(STATUS_FILTERS)
FIELDS = ("status", "tool", "owner", "queue", "since", "until", "job", "limit", "order", "sort")
FILTERS = tuple(name for name in FIELDS if name not in ("limit", "order", "sort"))
"""The fields that choose tasks (a bulk action's filter); ``limit``, ``order`` and ``sort`` only
show them."""
ORDERS = ("newest", "oldest")
SORTS = ("created", "finished")
PAGE_ROWS = 50
MAX_PAGE_ROWS = 500
MAX_FIELD_CHARS = 256


class BadFilter(ValueError):
    """A query parameter the list cannot apply (its message is shown on the page)."""


def _when(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(f"{name}: not a date and time (2026-12-03T10:00)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def parse(params: Mapping[str, str]) -> TaskFilter:
    """The filter a list URL names (empty values mean no filter)."""
    given = {
        name: params[name].strip() for name in (*FIELDS, "before", "after") if params.get(name, "").strip()
    }
    for name, value in given.items():
        if len(value) > MAX_FIELD_CHARS:
            raise BadFilter(f"{name}: at most {MAX_FIELD_CHARS} characters")
        if "\x00" in value:  # Postgres text holds no NUL: refused here, not by the driver
            raise BadFilter(f"{name}: a NUL character")
    status = given.get("status")
    if status is not None and status not in STATUS_FILTERS:
        raise BadFilter(f"status: one of {', '.join(STATUSES)}")
    sorted_by = sort(params)
    return TaskFilter(
        status=status,
        tool=given.get("tool"),
        owner=given.get("owner"),
        queue=given.get("queue"),
        since=_when("since", given["since"]) if "since" in given else None,
        until=_when("until", given["until"]) if "until" in given else None,
        job=given.get("job"),
        before=_cursor("before", given.get("before"), sorted_by),
        after=_cursor("after", given.get("after"), sorted_by),
        sort=sorted_by,
    )


def _cursor(name: str, given: str | None, sorted_by: str) -> tuple[datetime, str] | None:
    if given is None:
        return None
    at, sep, job = given.rpartition("~")
    if not sep or not job:
        raise BadFilter(f"{name}: not a page cursor")
    key, tilde, moment = at.rpartition("~")
    if (key if tilde else "created") != sorted_by:
        raise BadFilter(f"{name}: a page cursor of another sort (start again from the first page)")
    return (_when(name, moment), job)


def filter_fields(params: Mapping[str, str]) -> dict[str, str]:
    """The filter's own fields of a list URL (no cursor, no page size)."""
    return {name: params[name] for name in FILTERS if params.get(name, "").strip()}


def sort(params: Mapping[str, str]) -> str:
    """``?sort=finished``: by finish time (finished tasks only); else by creation time. Another
    key would need an index of its own, and a key that changes with the status (last update)
    would end the table's HOT updates (``console_queries.SORT_KEYS``)."""
    given = params.get("sort", "").strip() or "created"
    if given not in SORTS:
        raise BadFilter(f"sort: one of {', '.join(SORTS)}")
    return given


def oldest(params: Mapping[str, str]) -> bool:
    """``?order=oldest``: oldest first (the same index, read forwards; pages by ``after``).
    Other orders (last update, status) would each need an index of their own on the table."""
    given = params.get("order", "").strip() or "newest"
    if given not in ORDERS:
        raise BadFilter(f"order: one of {', '.join(ORDERS)}")
    return given == "oldest"


def page_size(params: Mapping[str, str]) -> int:
    """``?limit=N`` rows a page (default ``PAGE_ROWS``, at most ``MAX_PAGE_ROWS``)."""
    given = params.get("limit", "").strip()
    if not given:
        return PAGE_ROWS
    if not given.isdigit() or not 1 <= int(given) <= MAX_PAGE_ROWS:
        raise BadFilter(f"limit: a number of rows from 1 to {MAX_PAGE_ROWS}")
    return int(given)


def query(params: Mapping[str, str], **changes: str | None) -> str:
    """The list's query string with ``changes`` applied (None drops a parameter)."""
    kept = {name: params[name] for name in (*FIELDS, "before", "after") if params.get(name)}
    for name, value in changes.items():
        if value is None:
            kept.pop(name, None)
        else:
            kept[name] = value
    return urlencode(kept)


def cursor(row: Mapping[str, object], sorted_by: str = "created") -> str:
    """The ``before`` (or, oldest first, ``after``) value that continues after ``row``."""
    if sorted_by == "finished":
        finished = row["finished_at"]
        assert isinstance(finished, datetime)
        return f"finished~{finished.isoformat()}~{row['job_id']}"
    created = row["created_at"]
    assert isinstance(created, datetime)
    return f"{created.isoformat()}~{row['job_id']}"


def sort_links(params: Mapping[str, str]) -> dict[str, str]:
    """Each sort's column-header query string: the first page of that sort, newest first, or
    oldest first when the list already shows it newest first (a second click reverses it)."""
    current, reversed_ = sort(params), oldest(params)
    links = {}
    for name in SORTS:
        flip = name == current and not reversed_
        links[name] = query(
            params,
            sort=None if name == "created" else name,
            order="oldest" if flip else None,
            before=None,
            after=None,
        )
    return links
