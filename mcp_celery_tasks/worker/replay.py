"""One ask of a running job against what earlier runs of the same job recorded: which answers to
replay, which input rows to open, which stale questions to supersede (S-26: a key never names two
requests). Pure: no store, no broker."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.store.records import InputItem, InputRecord

__all__ = ["Plan", "Requests", "plan_ask"]

_AUTO_KEY = re.compile(r"\d+-[0-9a-f]{16}")

Requests = Mapping[str, tuple[str, Mapping[str, object] | None, str]]
"""``{key: (method, params, params hash)}``: the input requests of one ask."""


@dataclass(slots=True)
class Plan:
    """One ask against what earlier runs recorded: answers to replay, rows to open."""

    stored_key: dict[str, str] = field(default_factory=dict)  # the author's key -> the row's key
    to_open: list[InputItem] = field(default_factory=list)
    supersede: list[str] = field(default_factory=list)
    answers: dict[str, JSONObject] = field(default_factory=dict)

    @property
    def pending(self) -> dict[str, str]:
        return {key: stored for key, stored in self.stored_key.items() if key not in self.answers}


def plan_ask(requests: Requests, recorded: dict[str, InputRecord]) -> Plan:
    """Match one ask against what earlier runs of the job recorded."""
    plan = Plan()
    for key, (method, params, digest) in requests.items():
        aliases = [key, *sorted(k for k in recorded if k.startswith(key + "~"))]
        match = next(
            (
                k
                for k in aliases
                if k in recorded and recorded[k].params_hash == digest and not recorded[k].superseded
            ),
            None,
        )
        if match is not None:
            plan.stored_key[key] = match  # asked before (a re-run): replay the answer or wait on
            continue
        if _AUTO_KEY.fullmatch(key):
            # An automatic key is ``<ordinal>-<hash>``: the same ordinal with another hash
            # is the question this re-run no longer asks; it must not stay outstanding.
            ordinal = key.split("-", 1)[0] + "-"
            plan.supersede += [
                k
                for k, row in recorded.items()
                if k.startswith(ordinal) and k != key and row.response is None and not row.superseded
            ]
        new_key = key
        if key in recorded:
            # The key once named another request: never reuse it (S-26); ask anew.
            plan.supersede += [k for k in aliases if k in recorded and recorded[k].response is None]
            suffix = 2
            while f"{key}~{suffix}" in recorded:
                suffix += 1
            new_key = f"{key}~{suffix}"
        plan.stored_key[key] = new_key
        plan.to_open.append({"key": new_key, "method": method, "params": params, "params_hash": digest})
    plan.answers = {
        key: response
        for key, stored in plan.stored_key.items()
        if stored in recorded and (response := recorded[stored].response) is not None
    }
    return plan
