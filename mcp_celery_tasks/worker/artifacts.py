"""A job run's artifacts (``ctx.artifact``): validate, stream into the store, return the link.

The bytes go to Postgres in 1 MiB chunks, or to a file under ``artifact_dir``, each chunk its own
fenced statement (``store.artifact_calls``) that also checks ``max_artifact_bytes`` and the
principal's ``artifact_quota_bytes``: over either, the upload stops at that chunk, is removed, and
``ArtifactRefused`` (a ``ToolError``) names the limit. A run that is no longer the task's
(cancelled, finished, taken over) stops writing at the next chunk and stops as a cancelled run
does (``TaskCancelled``). What it wrote stays incomplete, never readable, until the collector's
orphan sweep. No Celery here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.artifact_calls import ArtifactLimits, NotOurs
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.tools.artifacts import (
    ArtifactData,
    ResourceLink,
    artifact_chunks,
    artifact_uri,
    checked_artifact_name,
    checked_mime_type,
)
from mcp_celery_tasks.worker.checkpoints import not_ours

__all__ = ["ArtifactRows", "JobArtifacts"]


class ArtifactRows(Protocol):
    """The store call of artifacts (``WorkerStore``)."""

    def write_artifact(
        self,
        task_id: str,
        worker: str,
        name: str,
        mime_type: str,
        chunks: Iterable[bytes],
        *,
        limits: ArtifactLimits = ...,
        directory: ArtifactDirectory | None = None,
    ) -> tuple[str, int, str]: ...


class JobArtifacts:
    """One job run's artifacts (``tools.artifacts.TaskArtifacts``)."""

    def __init__(
        self, store: ArtifactRows, task_id: str, worker: str, settings: Settings | None = None
    ) -> None:
        self._store, self._task_id, self._worker = store, task_id, worker
        self._limits = ArtifactLimits() if settings is None else ArtifactLimits.of(settings)
        self._directory = (
            ArtifactDirectory(settings.artifact_dir) if settings and settings.artifact_dir else None
        )

    def publish(self, name: str, data: ArtifactData, mime_type: str | None = None) -> ResourceLink:
        name = checked_artifact_name(name)
        mime = checked_mime_type(mime_type, name)
        try:
            artifact_id, size, _ = self._store.write_artifact(
                self._task_id, self._worker, name, mime, artifact_chunks(data),
                limits=self._limits, directory=self._directory,
            )  # fmt: skip
        except NotOurs:
            raise not_ours() from None
        return {"type": "resource_link", "uri": artifact_uri(artifact_id, name), "name": name,
                "mimeType": mime, "size": size}  # fmt: skip
