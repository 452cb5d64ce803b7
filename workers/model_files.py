"""Where the training examples keep models: one folder per principal under the models directory.

A principal's models live in ``$MCP_EXAMPLES_MODELS_DIR/<folder>/``, where ``<folder>`` is the
principal made safe for a file name plus a digest of it (``token_alice-3f2a9c01d4e5``): two
principals never share a folder (the digest tells ``token:a/b`` from ``token:a_b``), and a name a
caller gives is resolved inside their own folder only. A path that leaves it (``..``, an
absolute path elsewhere, a symlink) is refused by ``FileRoot``, like any path outside a root: one
principal can neither read nor replace another's model. A trained model is written there and
linked in the result as an artifact (``save_and_link``): the client reads the file's exact bytes
with ``resources/read``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from mcp_types import CallToolResult

from mcp_celery_tasks import FileRoot, TaskContext, ToolError

__all__ = [
    "MODELS_DIR",
    "check_writable",
    "principal_folder",
    "principal_models",
    "result_with_link",
    "save_and_link",
]

MODELS_DIR = "MCP_EXAMPLES_MODELS_DIR"


def principal_folder(principal: str) -> str:
    """The folder name of ``principal``'s models (readable, unique, never a path)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", principal).strip("._-")[:40] or "principal"
    return f"{readable}-{hashlib.sha256(principal.encode()).hexdigest()[:12]}"


def principal_models(principal: str, *, create: bool) -> FileRoot | None:
    """The output root of ``principal``'s models, None without a models directory. ``create``
    makes the folder (in the worker, before writing); the API only resolves names in it.

    Raises:
        ToolError: the folder's place holds something other than a directory (a symlink planted
            there is never followed).
    """
    base = FileRoot.from_env(MODELS_DIR)
    if base is None:
        return None
    folder = base.directories[0] / principal_folder(principal)
    if create:
        os.makedirs(base.directories[0], exist_ok=True)
        try:
            os.mkdir(folder, 0o777)
        except FileExistsError:
            if os.path.islink(folder) or not os.path.isdir(folder):
                raise ToolError(f"the models folder {folder} is not a directory") from None
    return FileRoot(folder, variable=MODELS_DIR)


class _Probe(Exception):
    """Leaves ``check_writable``'s trial write before anything is written."""


def check_writable(root: FileRoot, name: str, *, overwrite: bool) -> None:
    """Refuse, before any training, a name ``atomic_write`` would refuse (outside the folder, a
    symlink, an existing file without consent), leaving nothing behind.

    The weights are written only once training ends, not through a file held open meanwhile:
    a run killed mid-training (SIGKILL, the OOM killer) runs no cleanup, and an open temporary
    file would stay in the caller's folder.
    """
    try:
        with root.atomic_write(name, overwrite=overwrite):
            raise _Probe
    except _Probe:
        pass


def save_and_link(
    ctx: TaskContext, root: FileRoot, name: str, weights: io.BytesIO, *, overwrite: bool
) -> Mapping[str, object]:
    """Write ``weights`` as model ``name`` (atomically, replacing a file only with ``overwrite``)
    and publish the same bytes as an artifact named after the file: its ``resource_link``."""
    with root.atomic_write(name, overwrite=overwrite) as handle:
        handle.write(weights.getbuffer())
    weights.seek(0)
    return ctx.artifact(os.path.basename(name), weights, "application/octet-stream")


def result_with_link(summary: dict[str, Any], link: Mapping[str, object]) -> CallToolResult:
    """``summary`` as structured content (and its JSON as text), with ``link`` beside it."""
    text = json.dumps(summary, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}, dict(link)], "structuredContent": summary}
    )
