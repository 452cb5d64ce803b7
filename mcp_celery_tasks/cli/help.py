"""Help screens without typer's ``<str>``/``<bool>``/``<list[str]>`` type tags.

Typer prints each parameter's Python type beside it; for a person at a terminal an option's
metavar (``--arg KEY=VALUE``, ``--answers FILE``) says what to type, and a flag needs nothing.
"""

from __future__ import annotations

from typing import Any

import typer.core

__all__ = ["PlainHelpCommand", "PlainHelpGroup"]


def _untagged(params: list[Any]) -> list[Any]:
    for param in params:
        shown = param.metavar if isinstance(param, typer.core.TyperOption) else None
        # Only help screens call display_type_rich; parsing never does.
        vars(param)["display_type_rich"] = lambda ctx, shown=shown: shown
    return params


class PlainHelpCommand(typer.core.TyperCommand):
    """A command whose help shows metavars, not Python types."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _untagged(super().get_params(ctx))


class PlainHelpGroup(typer.core.TyperGroup):
    """The command group, likewise (its ``--help`` line)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _untagged(super().get_params(ctx))
