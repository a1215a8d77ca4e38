"""What the PostgreSQL benchmarks share: the server they measure against."""

from __future__ import annotations

import os

#: The server's URL, as for the tests (`scripts/start_postgres.sh DIR` prints one).
PG_ENV = "SVTAGG_TEST_POSTGRES"


def server_url() -> str:
    """The PostgreSQL server to measure against; exits with a hint without one."""
    url = os.environ.get(PG_ENV)
    if not url:
        raise SystemExit(f"set {PG_ENV} (scripts/start_postgres.sh DIR prints one)")
    return url
