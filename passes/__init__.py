"""The `pw` passes (one per module) and the registry that names them.

Importing this package registers every pass and pipeline.
"""

from . import verify  # noqa: F401  (registers pw-verify)
