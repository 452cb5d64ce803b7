"""Resources served as they are, beside the artifacts: a fixed uri (``add_resource``) or a uri
template (``add_template``), registered when a tool module is imported, as ``@tool`` registers a
tool. None are registered by default; the test fixtures register the conformance suite's
(``tests/fixtures/conformance_resources.py``).

A fixed resource belongs to no principal: every caller lists and reads it, so it holds nothing
private. Its uri never starts with ``mcp-tasks://artifacts/`` (a fixed resource never shadows an
artifact). A template is RFC 6570 level 1 only (``{name}`` expansions, each one uri segment: no
``/``, ``?`` or ``#`` in a value); its ``render`` gets the values by name. No SQL and no protocol
here: ``protocol.resources`` serves them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from mcp_celery_tasks.tools.artifacts import ARTIFACT_URI_PREFIX

__all__ = [
    "FixedResource",
    "ResourceTemplate",
    "add_resource",
    "add_template",
    "clear_fixed_resources",
    "find_fixed",
    "fixed_resources",
    "resource_templates",
]

Content = str | bytes
"""Text (served as ``text``) or bytes (served as a base64 ``blob``)."""

_EXPANSION: Final = re.compile(r"\{([A-Za-z0-9_]+)\}")


@dataclass(frozen=True)
class FixedResource:
    uri: str
    name: str
    mime_type: str
    content: Content
    description: str | None = None


@dataclass(frozen=True)
class ResourceTemplate:
    uri_template: str
    name: str
    mime_type: str
    render: Callable[[Mapping[str, str]], Content]
    description: str | None = None
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _EXPANSION.split(self.uri_template)  # literal, name, literal, name, …
        if any(brace in literal for literal in parts[::2] for brace in "{}"):
            raise ValueError(f"{self.uri_template!r}: only {{name}} expansions (RFC 6570 level 1)")
        pattern = "".join(
            re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/?#]+)" for i, part in enumerate(parts)
        )
        object.__setattr__(self, "_pattern", re.compile(pattern))

    def match(self, uri: str) -> dict[str, str] | None:
        """The expansion values that make ``uri``, or None when the template does not make it."""
        found = self._pattern.fullmatch(uri)
        return found.groupdict() if found else None


_RESOURCES: dict[str, FixedResource] = {}
_TEMPLATES: dict[str, ResourceTemplate] = {}


def _check_uri(uri: str) -> None:
    if uri.startswith(ARTIFACT_URI_PREFIX):
        raise ValueError(f"{uri!r}: {ARTIFACT_URI_PREFIX} uris are the artifacts'")


def add_resource(resource: FixedResource) -> FixedResource:
    """Serve ``resource`` (one per uri: registering a uri again replaces it, as a reload does)."""
    _check_uri(resource.uri)
    _RESOURCES[resource.uri] = resource
    return resource


def add_template(template: ResourceTemplate) -> ResourceTemplate:
    """Serve every uri ``template`` makes (one per template string)."""
    _check_uri(template.uri_template)
    _TEMPLATES[template.uri_template] = template
    return template


def fixed_resources() -> list[FixedResource]:
    return list(_RESOURCES.values())


def resource_templates() -> list[ResourceTemplate]:
    return list(_TEMPLATES.values())


def find_fixed(uri: str) -> tuple[str, Content] | None:
    """The mime type and content of the fixed resource ``uri`` names (a registered uri first,
    then the first template that makes it), or None; never for an artifact's uri, whatever a
    template would make."""
    if uri.startswith(ARTIFACT_URI_PREFIX):
        return None
    resource = _RESOURCES.get(uri)
    if resource is not None:
        return resource.mime_type, resource.content
    for template in _TEMPLATES.values():
        values = template.match(uri)
        if values is not None:
            return template.mime_type, template.render(values)
    return None


def clear_fixed_resources() -> None:
    """Forget every registration (tests)."""
    _RESOURCES.clear()
    _TEMPLATES.clear()
