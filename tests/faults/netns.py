"""Hosts of their own on one machine: a network namespace per host, all wired to a router
namespace, and faults injected on the router with nftables (issue 28's partition suite).

Each host ``h`` gets a veth pair ``eth0`` (in the host) ↔ ``<h>`` (in the router) on a /24 of
its own (``10.B.i.2`` for the host, ``10.B.i.1`` for the router), with a default route through
the router; the test process itself reaches every host through one more link from the root
namespace (``10.B.0.2``, a route to ``10.B.0.0/16``). The second octet ``B`` is drawn per run
and checked against the root namespace's routes, and every name carries the run's id, so runs
never clash; ``close`` removes every namespace and the root link (deleting a namespace deletes
its veth ends), also after a failure.

Faults are rules in the router's ``forward`` chain, so packets are lost on the wire between two
hosts, silently (no RST, no ICMP): the hosts' own stacks only see silence, as with a dead switch
port. ``cut(a, b)`` drops both ways, ``cut(a, b, one_way=True)`` only a → b, ``lose(a, b, pct)``
drops that share of the packets both ways at random (nftables ``numgen random``), and ``heal``
removes every rule. The kernel of this machine kind has no ``netem`` qdisc, so there is no
packet delay here (see ``unsupported_reason``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TABLE = "mcpt_faults"


def _run(*args: str, netns: str | None = None, stdin: str | None = None) -> str:
    command = ["ip", "netns", "exec", netns, *args] if netns else list(args)
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def unsupported_reason() -> str | None:
    """Why this machine cannot run the partition suite (one sentence), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2, nftables)"
    probe = f"mcpt-probe-{uuid.uuid4().hex[:8]}"
    try:
        _run("ip", "netns", "add", probe)
        _run("nft", "add", "table", "inet", TABLE, netns=probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` or nftables does not work here: {exc}"
    finally:
        with contextlib.suppress(Exception):
            _run("ip", "netns", "delete", probe)
    return None


def _free_block() -> int:
    """A second octet ``B`` whose 10.B.0.0/16 no route of the root namespace touches."""
    taken = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in _run("ip", "-4", "route", "show", "table", "all").splitlines()
        if line and line.split()[0][0].isdigit()
    ]
    for _ in range(200):
        block = random.randint(64, 250)
        net = ipaddress.ip_network(f"10.{block}.0.0/16")
        if not any(net.overlaps(other) for other in taken if other.prefixlen > 0):
            return block
    raise RuntimeError("no free 10.x.0.0/16 for the partition suite's hosts")


@dataclass
class Network:
    """The router and the hosts of one run; ``ip(host)`` is a host's address."""

    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    block: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # name -> subnet index (1..)
    _root_link: str | None = None
    _namespaces: list[str] = field(default_factory=list)

    @property
    def router(self) -> str:
        return self.netns("router")

    def netns(self, host: str) -> str:
        # The owner's pid in the name: a later run removes what a killed one left (``sweep_stale``).
        return f"mcpt{self.run}p{os.getpid()}-{host}"

    def ip(self, host: str) -> str:
        return f"10.{self.block}.{self.hosts[host]}.2"

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.netns(host)]

    def start(self, hosts: list[str]) -> Network:
        sweep_stale()
        self.block = _free_block()
        self._add_namespace(self.router)
        _run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward", netns=self.router)
        _run("ip", "link", "set", "lo", "up", netns=self.router)
        # The test process's way in: from the root namespace to the router.
        self._root_link = f"mcpt{self.run}"
        _run(
            "ip", "link", "add", self._root_link, "type", "veth", "peer", "name", "root", "netns", self.router
        )
        _run("ip", "addr", "add", f"10.{self.block}.0.2/24", "dev", self._root_link)
        _run("ip", "link", "set", self._root_link, "up")
        self._router_side("root", 0)
        _run("ip", "route", "add", f"10.{self.block}.0.0/16", "via", f"10.{self.block}.0.1")
        for index, host in enumerate(hosts, start=1):
            self.hosts[host] = index
            ns = self.netns(host)
            self._add_namespace(ns)
            _run(
                "ip",
                "link",
                "add",
                "eth0",
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                host,
                "netns",
                self.router,
            )
            _run("ip", "addr", "add", f"{self.ip(host)}/24", "dev", "eth0", netns=ns)
            _run("ip", "link", "set", "eth0", "up", netns=ns)
            _run("ip", "link", "set", "lo", "up", netns=ns)
            _run("ip", "route", "add", "default", "via", f"10.{self.block}.{index}.1", netns=ns)
            self._router_side(host, index)
        _run(
            "nft", "-f", "-", netns=self.router,
            stdin=f"table inet {TABLE} {{ chain forward {{ type filter hook forward priority 0; }}; }}",
        )  # fmt: skip
        return self

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)

    def _router_side(self, device: str, index: int) -> None:
        _run("ip", "addr", "add", f"10.{self.block}.{index}.1/24", "dev", device, netns=self.router)
        _run("ip", "link", "set", device, "up", netns=self.router)

    # ---- faults -------------------------------------------------------------------------------

    def _drop(self, source: str, target: str, extra: str = "") -> None:
        rule = f"ip saddr {self.ip(source)} ip daddr {self.ip(target)} {extra} drop"
        _run("nft", "add", "rule", "inet", TABLE, "forward", *rule.split(), netns=self.router)

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Packets from ``a`` to ``b`` (and back, unless ``one_way``) vanish on the wire."""
        self._drop(a, b)
        if not one_way:
            self._drop(b, a)

    def lose(self, a: str, b: str, percent: int) -> None:
        """``percent`` % of the packets between ``a`` and ``b`` (each way) vanish at random."""
        chance = f"numgen random mod 100 < {percent}"
        self._drop(a, b, chance)
        self._drop(b, a, chance)

    def heal(self) -> None:
        _run("nft", "flush", "chain", "inet", TABLE, "forward", netns=self.router)

    def rules(self) -> str:
        return _run("nft", "list", "chain", "inet", TABLE, "forward", netns=self.router)

    def close(self) -> None:
        """Remove every namespace (their veth ends go with them) and the root link's route."""
        if self._root_link is not None:
            with contextlib.suppress(Exception):
                _run("ip", "link", "delete", self._root_link)
        for name in reversed(self._namespaces):
            with contextlib.suppress(Exception):
                _run("ip", "netns", "delete", name)
        self._namespaces.clear()


@contextlib.contextmanager
def network(hosts: list[str]) -> Iterator[Network]:
    """A started ``Network`` of ``hosts``, torn down afterwards whatever happened."""
    net = Network()
    try:
        yield net.start(hosts)
    finally:
        net.close()


_OURS = re.compile(r"^mcpt([0-9a-f]{6})p(\d+)-")


def sweep_stale() -> None:
    """Remove the namespaces and root links of runs whose pytest process is gone (killed before
    its finalizers ran): each name carries its owner's pid."""
    for name in leftovers():
        found = _OURS.match(name)
        if found is None or Path(f"/proc/{found.group(2)}").exists():
            continue
        with contextlib.suppress(Exception):  # Postgres and Redis outlive a killed pytest
            for pid in _run("ip", "netns", "pids", name).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(Exception):
            _run("ip", "netns", "delete", name)
        with contextlib.suppress(Exception):
            _run("ip", "link", "delete", f"mcpt{found.group(1)}")


def leftovers() -> list[str]:
    """Namespaces of this suite that exist now (a test checks that a run leaves none)."""
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.startswith("mcpt")]
