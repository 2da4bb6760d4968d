"""The `pw` passes (one per module) and the registry that names them.

Importing this package registers every pass and pipeline.
"""

from . import verify  # noqa: F401  (registers pw-verify)
from . import place  # noqa: F401  (registers pw-place)
from . import insert_transfers  # noqa: F401  (registers pw-insert-transfers)
from . import mark_static_subgraphs  # noqa: F401  (registers pw-mark-static-subgraphs)
from . import schedule  # noqa: F401  (registers pw-schedule)
from . import verify_schedule  # noqa: F401  (registers pw-verify-schedule)
from . import emit_plans  # noqa: F401  (registers pw-emit-plans)
from . import lower as _lower  # noqa: F401  (registers the pw-lower pipeline)
from .emit_plans import program_plans  # noqa: E402
from .lower import LoweringError, lower  # noqa: E402
