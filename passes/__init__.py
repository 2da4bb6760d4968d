"""The `pw` passes (one per module) and the registry that names them.

Importing this package registers every pass and pipeline.
"""

from . import verify  # noqa: F401  (registers pw-verify)
from . import place  # noqa: F401  (registers pw-place)
from . import insert_transfers  # noqa: F401  (registers pw-insert-transfers)
