"""Sluice from Python (docs/python.md).

``sluice.transfer_queue``: a client of the TransferQueue, Sluice's streaming
data hub (a ``sluice_queue_server`` over TCP, with the same-host shared-memory
data plane when there is one, or a hub inside this process).
``sluice.checkpoint_engine``: the CheckpointEngine, Sluice's versioned weight
hub: a trainer publishes ``state_dict`` versions (two-phase: all or nothing)
into a same-host shared-memory store or an in-process one; readers pin a
version and read its tensors without a copy while newer ones are published.
``sluice.errors``: the exceptions carrying the C++ core's error statuses.
``sluice.verl`` (imported on its own): the key-value calls of verl's
TransferQueue integration, with verl's names and value shapes, over
``sluice.transfer_queue``.

The package is built with the C++ tree (``cmake --build build/release``); put
``build/<preset>/python`` on ``PYTHONPATH`` to import it.
"""

# libtorch_python must be initialized before the extension loads: the
# extension converts torch tensors through it.
import torch  # noqa: F401

from . import _C  # noqa: F401
from . import checkpoint_engine
from . import errors
from . import transfer_queue
from .errors import Error

__version__ = "0.1.0"

__all__ = ["Error", "checkpoint_engine", "errors", "transfer_queue", "__version__"]
