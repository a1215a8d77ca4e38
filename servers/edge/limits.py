"""Per-caller rate limits: a token bucket per caller identity (the SHA-256 of
its client certificate, or its address on the certificate-less ingest port),
so one client cannot make a server grow queues without bound; an empty bucket
answers RESOURCE_EXHAUSTED at once instead of queueing."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    """`rate` requests per second per identity, bursts up to `burst`.

    Remembers at most `max_identities` buckets (least recently used dropped),
    so the limiter's own memory is bounded too.  rate <= 0 disables it."""

    rate: float
    burst: float
    max_identities: int = 100_000
    clock: Callable[[], float] = time.monotonic
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)

    def allow(self, identity: str, cost: float = 1.0) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        tokens, last = self._buckets.pop(identity, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= cost
        if ok:
            tokens -= cost
        self._buckets[identity] = (tokens, now)
        while len(self._buckets) > self.max_identities:
            self._buckets.popitem(last=False)
        return ok
