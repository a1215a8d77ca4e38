"""svtagg: the Sparse Vector Technique over two-server secure aggregation.

The Python front door for analysts::

    import svtagg

    with svtagg.connect("leader.example.org:7443", certs="certs/") as deployment:
        print(deployment.tasks())
        task = deployment.task("survey")
        print(task.budget())
        result = task.top_k(k=5, epsilon=1)

See `svtagg.deploy.connection` and docs/walkthrough.md.  The command line is `svtagg`
(`svtagg --help`); the layers live in `svtagg.mpc`, `svtagg.dp`, `svtagg.proto`,
`svtagg.client`, `svtagg.servers`, `svtagg.analyst` and `svtagg.deploy`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__: str = version("svtagg")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from svtagg.deploy.connection import Deployment, TaskHandle, connect

__all__ = ["Deployment", "TaskHandle", "__version__", "connect"]


def __getattr__(name: str) -> Any:
    # The front door loads gRPC and numpy only when it is used, so `svtagg
    # --version` and the layer packages do not pay for it.
    if name in ("connect", "Deployment", "TaskHandle"):
        from svtagg.deploy import connection

        return getattr(connection, name)
    raise AttributeError(f"module 'svtagg' has no attribute {name!r}")
