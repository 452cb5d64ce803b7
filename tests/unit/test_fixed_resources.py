"""Fixed resources and templates (``tools.fixed_resources``): what a template matches, what
registration refuses, and that the production tool modules register none. Served end to end by
the conformance suite's resources scenarios (tests/conformance, tests/fixtures/conformance_resources.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping

import pytest

from mcp_celery_tasks.tools.fixed_resources import (
    FixedResource,
    ResourceTemplate,
    add_resource,
    add_template,
    clear_fixed_resources,
    find_fixed,
    fixed_resources,
    resource_templates,
)
from tests.support import ROOT


@pytest.fixture
def registry() -> Iterator[None]:
    """An empty registry for the test; what was registered before comes back after."""
    resources, templates = fixed_resources(), resource_templates()
    clear_fixed_resources()
    try:
        yield
    finally:
        clear_fixed_resources()
        for resource in resources:
            add_resource(resource)
        for template in templates:
            add_template(template)


def echo(values: Mapping[str, str]) -> str:
    return repr(sorted(values.items()))


def test_a_template_matches_one_segment_per_expansion_and_nothing_else() -> None:
    template = ResourceTemplate("test://t/{id}/data/{part}", "t", "text/plain", echo)
    assert template.match("test://t/123/data/x.y") == {"id": "123", "part": "x.y"}
    for other in ["test://t/1/2/data/x", "test://t//data/x", "test://t/1/data/x?y=1", "test://t/1/data/x#f",
                  "test://t/1/data/", "xtest://t/1/data/x", "test://t/1/datax/x"]:  # fmt: skip
        assert template.match(other) is None, other
    dots = ResourceTemplate("a.b://{x}", "d", "text/plain", echo)
    assert dots.match("a.b://1") == {"x": "1"} and dots.match("aXb://1") is None  # literals are literal


@pytest.mark.parametrize(
    "uri_template", ["test://{?offset,length}", "test://{+path}", "test://{a", "test://a}"]
)
def test_a_template_beyond_level_1_is_refused(uri_template: str) -> None:
    with pytest.raises(ValueError, match="RFC 6570 level 1"):
        ResourceTemplate(uri_template, "t", "text/plain", echo)


@pytest.mark.usefixtures("registry")
def test_a_fixed_resource_never_takes_an_artifact_uri() -> None:
    with pytest.raises(ValueError, match="artifacts"):
        add_resource(FixedResource("mcp-tasks://artifacts/x/y", "y", "text/plain", "shadow"))
    with pytest.raises(ValueError, match="artifacts"):
        add_template(ResourceTemplate("mcp-tasks://artifacts/{id}/y", "y", "text/plain", echo))
    assert fixed_resources() == [] and resource_templates() == []
    add_template(ResourceTemplate("{scheme}://artifacts/{id}/{name}", "any", "text/plain", echo))
    assert find_fixed("mcp-tasks://artifacts/abc/weights.bin") is None  # still the artifact's
    assert find_fixed("other://artifacts/abc/weights.bin") is not None


@pytest.mark.usefixtures("registry")
def test_a_registered_uri_is_found_before_a_template_that_also_makes_it() -> None:
    add_template(ResourceTemplate("test://r/{id}", "r", "application/json", echo))
    add_resource(FixedResource("test://r/fixed", "fixed", "image/png", b"\x89PNG"))
    assert find_fixed("test://r/fixed") == ("image/png", b"\x89PNG")
    assert find_fixed("test://r/7") == ("application/json", "[('id', '7')]")
    assert find_fixed("test://nothing") is None


def test_the_production_tool_modules_register_no_fixed_resource() -> None:
    code = (
        "from mcp_celery_tasks.tools.registry import load_tool_modules\n"
        "from mcp_celery_tasks.tools.fixed_resources import fixed_resources, resource_templates\n"
        "load_tool_modules(['workers'])\n"
        "print(len(fixed_resources()), len(resource_templates()))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["0", "0"]
