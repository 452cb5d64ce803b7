"""MRTR rounds of a tools/call (SEP-2322): questions asked before a task exists (``ask_first``),
and input requests of a synchronous call's job relayed to its caller.

The round's ``requestState`` is sealed (``sealing``) and bound to the principal, the tool and a
hash of the arguments, so a retry can neither be forged nor replayed for another call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypedDict, cast

from mcp_celery_tasks.errors import InvalidParams, MissingCapability
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.protocol.sealing import ALREADY_USED, arguments_hash, spent_digest
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.tasks.service import InputRequest, RequestContext
from mcp_celery_tasks.tools.inputs import CAPABILITY_FOR, Elicit, validate_response
from mcp_celery_tasks.tools.registry import ToolSpec
from mcp_celery_tasks.wire import InputRequired

__all__ = ["RoundState", "input_required", "open_state", "preflight", "spend"]


class RoundState(TypedDict, total=False):
    """What a round seals into ``requestState`` besides its binding (``p``, ``t``, ``a``,
    ``exp``): ``k`` is ``"pre"`` with the answers ``ans`` collected before a task exists, or
    ``"task"`` with the ``task`` whose synchronous job asked for input."""

    k: Literal["pre", "task"]
    ans: JSONObject
    task: str
    n: str
    exp: int


def open_state(
    services: Services, ctx: RequestContext, spec: ToolSpec, arguments: JSONObject, state: str | None
) -> RoundState | None:
    """The payload of a retried round's ``requestState`` (-32602 if it does not open for this
    principal, tool and arguments, or has expired); None for a first round."""
    if state is None:
        return None
    opened = services.sealer.open(state, p=ctx.principal, t=spec.name, a=arguments_hash(arguments))
    return cast(RoundState, opened)


async def spend(services: Services, state: RoundState | None) -> None:
    """The round advanced with ``state``: it is not usable again, on any replica (a replay is
    -32602). The process's own set answers a replay to this replica without a query; the shared
    record (one INSERT … ON CONFLICT) decides between replicas, and between two replays racing
    here. A spend the database did not record (it was unreachable) is forgotten locally, so the
    client may retry with the same state."""
    if state is None:
        return
    payload = cast(JSONObject, state)
    spent = spent_digest(payload)
    services.sealer.spend(payload)
    if spent is None:
        return
    try:
        fresh = await services.tasks.spend_request_state(*spent)
    except BaseException:
        services.sealer.unspend(payload)
        raise
    if not fresh:
        raise InvalidParams(ALREADY_USED)


def preflight(
    ctx: RequestContext,
    questions: dict[str, Elicit],
    state: RoundState | None,
    responses: Mapping[str, object],
) -> tuple[JSONObject, dict[str, InputRequest]]:
    """(answers collected so far, the questions still to ask as ``inputRequests`` entries).

    Answers of earlier rounds come from the sealed state; this round's are validated against
    their question. A question of a kind the request did not declare is -32021 (MRTR: never ask
    for an undeclared kind).
    """
    collected: JSONObject = dict((state or {}).get("ans") or {})
    capabilities = ctx.meta.client_capabilities if ctx.meta else {}
    for key, question in questions.items():
        if key in collected:
            continue
        if key in responses:
            collected[key] = validate_response(key, question.method, question.params, responses[key])
        elif CAPABILITY_FOR[question.method] not in capabilities:
            needed = CAPABILITY_FOR[question.method]
            raise MissingCapability(f"The tool asks first and needs the {needed!r} capability", {needed: {}})
    missing: dict[str, InputRequest] = {
        key: {"method": question.method, "params": question.params}
        for key, question in questions.items()
        if key not in collected
    }
    return collected, missing


def input_required(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: JSONObject,
    state: RoundState,
    requests: Mapping[str, InputRequest],
) -> InputRequired:
    """An ``InputRequiredResult`` whose sealed ``requestState`` carries ``state`` to the retry."""
    sealed = services.sealer.seal(
        {**state, "p": ctx.principal, "t": spec.name, "a": arguments_hash(arguments)},
        services.settings.request_state_ttl_seconds,
    )
    return InputRequired(input_requests=dict(requests), request_state=sealed)
