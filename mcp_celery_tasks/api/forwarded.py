"""Who is the client: the connection's peer, or the address a trusted reverse proxy forwarded.

Behind a reverse proxy every connection comes from the proxy, so per-address limits keyed by the
peer would put every user in one bucket (one of them holding its share locks out the rest). A
forwarded-for header is believed only when the peer is one of ``trusted_proxies`` (CIDRs): from
anyone else it is just a header a client wrote. The list is read from the right, skipping
trusted proxies, so an address a client put in the header itself (``X-Forwarded-For: 1.2.3.4``,
to which nginx appends the real one) is never taken for the client.

Only one header is honoured (``forwarded_header``): a proxy that sets ``X-Forwarded-For`` passes a
client's own ``Forwarded`` header through untouched, and believing it would let the client pick
its address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

__all__ = ["Networks", "client_address", "forwarded_chain", "networks"]

Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def networks(cidrs: Iterable[str]) -> Networks:
    """The parsed ``trusted_proxies`` setting (a bare address is a one-address network)."""
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs if cidr.strip())


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: str, trusted: Networks) -> bool:
    parsed = _address(address)
    return parsed is not None and any(parsed in network for network in trusted)


def _forwarded_node(value: str) -> str:
    """One ``for=`` node of RFC 7239 as a bare address: quotes, brackets and a port removed."""
    node = value.strip().strip('"')
    if node.startswith("["):
        return node[1:].partition("]")[0]
    if node.count(":") == 1:  # IPv4 with a port; a bare IPv6 address has several colons
        return node.partition(":")[0]
    return node


def forwarded_chain(headers: Sequence[tuple[bytes, bytes]], header: str) -> list[str]:
    """The addresses the proxies recorded, oldest first, from every ``header`` line in order."""
    wanted = header.lower().encode("latin-1")
    chain: list[str] = []
    for name, raw in headers:
        if name.lower() != wanted:
            continue
        value = raw.decode("latin-1")
        if wanted == b"forwarded":
            for element in value.split(","):
                for pair in element.split(";"):
                    key, _, item = pair.partition("=")
                    if key.strip().lower() == "for":
                        chain.append(_forwarded_node(item))
        else:
            chain.extend(part.strip() for part in value.split(",") if part.strip())
    return chain


def client_address(
    peer: str, headers: Sequence[tuple[bytes, bytes]], trusted: Networks, header: str = "x-forwarded-for"
) -> str:
    """The client's address: ``peer``, unless ``peer`` is a trusted proxy that forwarded one.

    Walks the chain from the right past trusted proxies; the first other entry is the client. An
    entry that is not an address (``unknown``, an obfuscated RFC 7239 node) stops the walk at the
    last proxy that wrote it: nothing left of it can be believed.
    """
    if not trusted or not _trusted(peer, trusted):
        return peer
    client = peer
    for entry in reversed(forwarded_chain(headers, header)):
        parsed = _address(entry)
        if parsed is None:
            return client
        client = str(parsed)
        if not _trusted(client, trusted):
            return client
    return client
