"""What one API process shares between requests: the bundle every handler receives.

Built once by ``api.compose.running`` and handed to requests as lifespan state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcp_celery_tasks.protocol.holds import Holds
from mcp_celery_tasks.protocol.sealing import Sealer
from mcp_celery_tasks.protocol.shapes import ServerInfo
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.tasks.artifacts import ArtifactService
from mcp_celery_tasks.tasks.events import TaskEvents
from mcp_celery_tasks.tasks.service import Publisher, TaskService

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    """What one API process shares between requests (built by ``api.compose.running``)."""

    settings: Settings
    tasks: TaskService
    store: ApiStore
    events: TaskEvents
    publisher: Publisher
    sealer: Sealer
    server_version: str
    subscriptions: dict[str, int] = field(default_factory=dict)
    """Open subscriptions per principal in this process."""
    holds: Holds = field(default_factory=Holds)
    """Synchronous waits and open streams per principal in this process (``holds``)."""
    console_store: ApiStore | None = None
    """The console's own pool on ``console_database_url`` (an admin login), when set."""

    @property
    def server_info(self) -> ServerInfo:
        return {"name": self.settings.server_name, "version": self.server_version}

    @property
    def console_writes(self) -> ApiStore:
        """Where the console's admin writes go (limits, its audit): its own admin pool, else the
        API's."""
        return self.console_store or self.store

    @property
    def artifacts(self) -> ArtifactService:
        """The caller-scoped artifact reads (``tasks.artifacts``)."""
        directory = self.settings.artifact_dir
        return ArtifactService(self.store, ArtifactDirectory(directory) if directory else None)
