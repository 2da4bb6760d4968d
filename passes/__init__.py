"""The `pw` passes (one per module) and the registry that names them.

Importing this package registers every pass and pipeline. The lowering API:

    lower(module_or_text, topology, strategy="auto", pin="") -> ir.Module
    program_plans(lowered_module) -> dict[str, ProgramPlan]
"""

from . import verify  # noqa: F401  (registers pw-verify)
from . import place  # noqa: F401  (registers pw-place)
from . import alias_slices  # noqa: F401  (registers pw-alias-slices)
from . import insert_transfers  # noqa: F401  (registers pw-insert-transfers)
from . import mark_static_subgraphs  # noqa: F401  (registers pw-mark-static-subgraphs)
from . import schedule  # noqa: F401  (registers pw-schedule)
from . import verify_schedule  # noqa: F401  (registers pw-verify-schedule)
from . import fuse_launches  # noqa: F401  (registers pw-fuse-launches)
from . import plan_memory  # noqa: F401  (registers pw-plan-memory)
from . import emit_plans  # noqa: F401  (registers pw-emit-plans)
from . import verify_plans  # noqa: F401  (registers pw-verify-plans)
from .lower import LoweringError, lower  # registers the pw-lower pipeline
from pathways_mlir.dialect.plan_reader import program_plans

__all__ = ["LoweringError", "lower", "program_plans"]
