"""Failed sign-ins per client address: after ``LIMIT`` in ``WINDOW_S``, every sign-in from that
address is refused (429) until the oldest failure is a window old, the right token included, so a
token cannot be guessed faster than that. Counted per API process (each replica counts its own);
the address is the ASGI scope's client: the peer, or behind a proxy listed in
``trusted_proxies`` the client it forwarded (``api.httpserver`` sets it, from those peers only,
as for the per-client connection limits; a header from anyone else is ignored). At most
``MAX_ADDRESSES`` are tracked: beyond them the address tracked longest is forgotten first."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from mcp_celery_tasks.console.security import Refused

__all__ = ["LIMIT", "WINDOW_S", "FailedLogins"]

LIMIT = 10
WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


class FailedLogins:
    def __init__(
        self,
        limit: int = LIMIT,
        window_s: float = WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window_s, self.max_addresses, self.clock = limit, window_s, max_addresses, clock
        self._failures: dict[str, collections.deque[float]] = {}

    def check(self, address: str) -> None:
        """``Refused(429)`` while ``address`` has ``limit`` failures in the window."""
        failures = self._recent(address)
        if failures is not None and len(failures) >= self.limit:
            wait = failures[0] + self.window_s - self.clock()
            raise Refused(429, f"too many failed sign-ins from this address; try again in {wait:.0f} s")

    def failed(self, address: str) -> None:
        failures = self._recent(address)
        if failures is None:
            while len(self._failures) >= self.max_addresses:
                del self._failures[next(iter(self._failures))]
            failures = self._failures[address] = collections.deque(maxlen=self.limit)
        failures.append(self.clock())

    def _recent(self, address: str) -> collections.deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        horizon = self.clock() - self.window_s
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures
