"""The client address behind a trusted reverse proxy: believed only from the proxy, read from
the right, one header only."""

from __future__ import annotations

import pytest

from mcp_celery_tasks.api.forwarded import client_address, networks

PROXIES = networks(["10.0.0.0/8", "192.0.2.1"])


def xff(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode()) for value in values]


def test_an_untrusted_peer_is_the_client_whatever_it_forwards() -> None:
    assert client_address("203.0.113.9", xff("198.51.100.1"), PROXIES) == "203.0.113.9"
    assert client_address("203.0.113.9", xff("198.51.100.1"), networks([])) == "203.0.113.9"


def test_the_rightmost_address_that_is_not_a_proxy_is_the_client() -> None:
    # The client wrote "1.2.3.4" itself; its proxy appended the real address, then a second proxy.
    chain = xff("1.2.3.4, 198.51.100.7", "10.1.2.3")
    assert client_address("10.0.0.5", chain, PROXIES) == "198.51.100.7"


def test_a_chain_of_proxies_only_ends_at_the_leftmost() -> None:
    assert client_address("10.0.0.5", xff("10.9.9.9, 192.0.2.1"), PROXIES) == "10.9.9.9"
    assert client_address("10.0.0.5", [], PROXIES) == "10.0.0.5"


@pytest.mark.parametrize("junk", ["unknown", "not an address", "999.1.1.1", "_hidden"])
def test_an_entry_that_is_not_an_address_stops_at_the_proxy_that_wrote_it(junk: str) -> None:
    assert client_address("10.0.0.5", xff(f"198.51.100.7, {junk}"), PROXIES) == "10.0.0.5"


def test_rfc7239_forwarded_is_read_only_when_configured() -> None:
    headers = [
        (b"forwarded", b'for="[2001:db8::1]:4711";proto=https, for=198.51.100.2:80'),
        (b"x-forwarded-for", b"198.51.100.99"),
    ]
    assert client_address("10.0.0.5", headers, PROXIES, "forwarded") == "198.51.100.2"
    assert client_address(
        "10.0.0.5", [*headers[:1], (b"forwarded", b"for=10.0.0.7")], PROXIES, "forwarded"
    ) == ("198.51.100.2")
    # The other header is ignored: the proxy passes a client's own Forwarded through untouched.
    assert client_address("10.0.0.5", headers, PROXIES) == "198.51.100.99"
    assert client_address(
        "10.0.0.5", [(b"forwarded", b'for="[2001:db8::1]:4711"')], PROXIES, "forwarded"
    ) == ("2001:db8::1")
