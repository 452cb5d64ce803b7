"""The console's sessions, CSRF tokens, filters and escaping, without a server."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest

from mcp_celery_tasks.console import listing
from mcp_celery_tasks.console.http import next_path
from mcp_celery_tasks.console.render import render, shown, text
from mcp_celery_tasks.console.security import Refused, Sessions
from mcp_celery_tasks.settings import Settings

TOKEN = "the-admin-token"
KEY = base64.urlsafe_b64encode(b"k" * 32).decode()


def _sessions(**extra: object) -> Sessions:
    admins = {"ops": hashlib.sha256(TOKEN.encode()).hexdigest()}
    settings = Settings(console_admin_tokens=admins, secret_keys=[KEY], **extra)  # type: ignore[arg-type]
    return Sessions(settings, is_tool_caller=lambda token: token == "caller-token")


def test_an_admin_token_signs_in_and_its_session_names_the_admin() -> None:
    sessions = _sessions()
    assert sessions.admin_name(f"  {TOKEN} ") == "ops"
    admin = sessions.admin(sessions.issue("ops"))
    assert admin.actor == "admin:ops" and admin.csrf


def test_a_tool_callers_token_is_refused_with_403_and_an_unknown_one_with_401() -> None:
    sessions = _sessions()
    with pytest.raises(Refused) as caller:
        sessions.admin_name("caller-token")
    assert caller.value.status == 403
    with pytest.raises(Refused) as unknown:
        sessions.admin_name("guess")
    assert unknown.value.status == 401
    with pytest.raises(Refused) as bearer:
        sessions.bearer("Bearer caller-token")
    assert bearer.value.status == 403


def test_a_forged_or_altered_session_cookie_is_refused() -> None:
    sessions = _sessions()
    cookie = sessions.issue("ops")
    body, _, signature = cookie.partition(".")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data["n"] = "root"
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    for bad in (None, "", "garbage", f"{forged}.{signature}", f"{body}.{signature[:-2]}xx"):
        with pytest.raises(Refused) as refused:
            sessions.admin(bad)
        assert refused.value.status == 401
    # Another deployment's key signs nothing here.
    other = Sessions(
        Settings(console_admin_tokens={"ops": "0" * 64}, secret_keys=["b" * 43]), lambda t: False
    )
    with pytest.raises(Refused):
        sessions.admin(other.issue("ops"))


def test_a_session_ends_when_it_expires_or_its_admin_token_is_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sessions = _sessions()
    cookie = sessions.issue("ops")
    later = time.time() + 9 * 3600
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(Refused, match="ended"):
        sessions.admin(cookie)
    monkeypatch.undo()
    removed = Sessions(Settings(console_admin_tokens={}, secret_keys=[KEY]), lambda t: False)
    with pytest.raises(Refused, match="ended"):
        removed.admin(cookie)


def test_the_csrf_token_is_bound_to_its_session() -> None:
    sessions = _sessions()
    first, second = sessions.admin(sessions.issue("ops")), sessions.admin(sessions.issue("ops"))
    assert first.csrf != second.csrf
    sessions.check_csrf(first, first.csrf)
    for presented in (None, "", second.csrf):
        with pytest.raises(Refused) as refused:
            sessions.check_csrf(first, presented)
        assert refused.value.status == 403


def test_after_sign_in_only_a_console_path_is_followed() -> None:
    assert next_path("/console/tasks?status=failed", "/console") == "/console/tasks?status=failed"
    for elsewhere in (
        "https://evil.example/",
        "//evil.example/console/",
        "/consolex",
        "/console/\\evil",
        None,
    ):
        assert next_path(elsewhere, "/console") == "/console/"


def test_filters_come_from_the_url_and_refuse_what_they_cannot_apply() -> None:
    where = listing.parse(
        {"status": "failed", "owner": "token:alice", "since": "2026-12-03T10:00", "job": ""}
    )
    assert (where.status, where.owner, where.job) == ("failed", "token:alice", None)
    assert where.since is not None and where.since.tzinfo is not None
    sql, params = where.statement(51)
    assert "t.owner = %(owner)s" in sql and "OFFSET" not in sql and params["limit"] == 51
    assert "IS NULL OR" not in sql  # no disjunction that would hide an index from a generic plan
    for bad in ({"status": "nope"}, {"since": "yesterday"}, {"before": "no-cursor"}, {"limit": "0"}):
        with pytest.raises(listing.BadFilter):
            where = listing.parse(bad)
            listing.page_size(bad)
    assert listing.query({"tool": "a b", "before": "x"}, before=None) == "tool=a+b"


def test_untrusted_text_renders_as_text() -> None:
    payload = "<script>alert(1)</script>\x1b]0;title\x07\u202egnp.exe"
    assert text(payload) == "<script>alert(1)</script>gnp.exe"
    page = render("refused.html", message=payload, prefix="/console")
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in shown({"text": payload}) and "\u202e" not in shown({"text": payload})


def test_the_console_is_served_only_when_enabled() -> None:
    from mcp_celery_tasks.api.server import create_server

    def paths(settings: Settings) -> set[str]:
        return {str(getattr(route, "path", "")) for route in create_server(settings).router.routes}

    assert not any(path.startswith("/console") for path in paths(Settings()))
    enabled = paths(Settings(console_enabled=True))
    assert {"/console/", "/console/tasks", "/console/tasks/{job_id}/cancel", "/console/audit"} <= enabled


def test_an_admin_entry_that_is_not_a_hash_stops_the_start() -> None:
    with pytest.raises(ValueError, match="SHA-256"):
        Sessions(Settings(console_admin_tokens={"ops": TOKEN}), lambda token: False)


def test_a_limits_form_is_applied_whole_or_refused() -> None:
    from mcp_celery_tasks.console.limits import parse_limits

    principal, limits = parse_limits({"principal": " token:alice ", "max_active_tasks": "7", "note": "batch"})
    assert (principal, limits) == ("token:alice", {"max_active_tasks": 7, "note": "batch"})
    assert parse_limits({"principal": "p", "creates_per_second": "0.5"})[1] == {"creates_per_second": 0.5}
    refusals = [
        {"principal": "", "max_active_tasks": "1"},
        {"principal": "p\x1b[2J", "max_active_tasks": "1"},
        {"principal": "p"},  # nothing to change
        {"principal": "p", "max_active_tasks": "-1"},
        {"principal": "p", "max_active_tasks": "1.5"},
        {"principal": "p", "creates_per_second": "nan"},
        {"principal": "p", "create_burst": "0"},
        {"principal": "p", "note": "n" * 501},
    ]
    for form in refusals:
        with pytest.raises(Refused) as refused:
            parse_limits(form)
        assert refused.value.status == 400, form


def test_a_session_names_its_nonce_and_issue_time_for_revocation_and_a_bearer_none() -> None:
    sessions = _sessions()
    before = int(time.time() * 1000)
    one, two = sessions.admin(sessions.issue("ops")), sessions.admin(sessions.issue("ops"))
    assert len(one.session) == 64 and one.session != two.session  # the nonce's SHA-256, per session
    assert before <= one.issued_ms <= int(time.time() * 1000)
    assert one.expires == one.issued_ms // 1000 + 8 * 3600
    assert sessions.bearer(f"Bearer {TOKEN}").session == ""


def test_a_cookie_issued_before_sessions_carried_their_issue_time_still_has_one() -> None:
    sessions = _sessions()
    expires = int(time.time()) + 3600
    payload = {"n": "ops", "x": expires, "c": "nonce"}  # as issued before "i"
    data = json.dumps(payload, separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(data).decode().rstrip("=")
    admin = sessions.admin(f"{body}.{sessions.keys.sign(data)}")
    assert admin.issued_ms == (expires - 8 * 3600) * 1000
    assert admin.session == hashlib.sha256(b"nonce").hexdigest()
