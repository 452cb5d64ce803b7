"""``call --save-artifacts``: the parts of saving that need no server. A hostile name becomes one
plain file name; a large artifact is read in ranges; the result view names links with sizes.
The saving itself, against a real server, is in tests/e2e/test_cli_artifacts.py."""

from __future__ import annotations

import pytest
from rich.console import Console

from mcp_celery_tasks.client.saving import (
    MAX_NAME_CHARS,
    MAX_READ_BYTES,
    artifact_links,
    link_size,
    part_uris,
    safe_file_name,
)
from mcp_celery_tasks.client.view import show_result, size_text
from mcp_celery_tasks.json_types import JSONObject


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("weights.npz", "weights.npz"),
        ("../../etc/x", "x"),
        ("..", "artifact"),
        ("/etc/passwd", "passwd"),
        ("..\\..\\boot.ini", "boot.ini"),
        (".bashrc", "bashrc"),
        ("a\x00b\x1b[2J\u202ec.txt", "a_b__2J_c.txt"),
        ("", "artifact"),
        (None, "artifact"),
        (42, "artifact"),
        ("x/", "artifact"),
        (" . ", "artifact"),
        ("-rf", "rf"),
        ("--help.txt", "help.txt"),
    ],
)
def test_a_hostile_name_becomes_one_plain_file_name(name: object, safe: str) -> None:
    assert safe_file_name(name) == safe


def test_a_huge_name_is_cut_keeping_its_extension() -> None:
    cut = safe_file_name("a" * 10_000 + ".ndjson")
    assert len(cut) == MAX_NAME_CHARS and cut.endswith("a.ndjson")
    assert len(safe_file_name("b" * 10_000)) == MAX_NAME_CHARS


def test_only_our_artifact_links_are_saved_and_a_size_must_be_a_byte_count() -> None:
    ours: JSONObject = {
        "type": "resource_link",
        "uri": "mcp-tasks://artifacts/abc/m.ndjson",
        "name": "m.ndjson",
    }
    result: JSONObject = {
        "content": [
            {"type": "text", "text": "summary"},
            ours,
            {"type": "resource_link", "uri": "file:///etc/passwd", "name": "passwd"},
            {"type": "resource_link", "uri": "https://evil.example/x", "name": "x"},
        ]
    }
    assert artifact_links(result) == [ours]
    assert [link_size({"size": s}) for s in (3, 0, -1, True, "3", 2.5)] == [3, 0, None, None, None, None]


def test_an_artifact_one_read_carries_is_read_whole_and_a_larger_one_in_ranges() -> None:
    uri = "mcp-tasks://artifacts/abc/w.bin"
    assert list(part_uris(uri, None)) == [(uri, None)]
    assert list(part_uris(uri, MAX_READ_BYTES)) == [(uri, MAX_READ_BYTES)]
    parts = part_uris(uri, MAX_READ_BYTES + 1, part_bytes=MAX_READ_BYTES // 2)
    half = MAX_READ_BYTES // 2
    assert list(parts) == [
        (f"{uri}?offset=0&length={half}", half),
        (f"{uri}?offset={half}&length={half}", half),
        (f"{uri}?offset={MAX_READ_BYTES}&length=1", 1),
    ]
    made_up = part_uris(uri, 10**18)  # a hostile size: parts are made as they are read
    assert next(made_up) == (f"{uri}?offset=0&length=8388608", 8388608)


def test_the_result_view_names_each_link_with_its_size() -> None:
    out = Console(width=200, force_terminal=False)
    link: JSONObject = {
        "type": "resource_link",
        "uri": "mcp-tasks://artifacts/abc/m.ndjson",
        "name": "m.ndjson",
    }
    with out.capture() as captured:
        show_result(out, {"content": [{**link, "size": 3 * 1024 * 1024 + 1}, link]})
    assert captured.get().splitlines() == [
        "[link] m.ndjson (3.0 MiB) mcp-tasks://artifacts/abc/m.ndjson",
        "[link] m.ndjson mcp-tasks://artifacts/abc/m.ndjson",
    ]
    assert [size_text(n) for n in (0, 1023, 1024, 1536, 5 << 30, 5000 << 30)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "1.5 KiB", "5.0 GiB", "5000.0 GiB",
    ]  # fmt: skip
