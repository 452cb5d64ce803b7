"""Options of ``call`` that live outside ``commands.py`` (which holds every command's body)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["SaveArtifactsOpt"]

SaveArtifactsOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-artifacts",
        metavar="DIR",
        help="Save every artifact the result links into DIR (created if missing; names made safe, "
        "an existing file never replaced)",
    ),
]
