"""The `pw` passes (one per module) and the registry that names them.

Importing this package registers every pass and pipeline. The lowering API:

    lower(module_or_text, topology, strategy="auto", pin="") -> ir.Module
    lower_to_plans(module_or_text, topology, ...) -> dict[str, ProgramPlan]
    load_plans(ir_text, topology_or_none) -> dict[str, ProgramPlan]
    program_plans(lowered_module) -> dict[str, ProgramPlan]
"""

from pathways_mlir.dialect.plan_reader import program_plans

from . import verify  # noqa: F401  (registers pw-verify)
from . import place  # noqa: F401  (registers pw-place)
from . import alias_slices  # noqa: F401  (registers pw-alias-slices)
from . import insert_transfers  # noqa: F401  (registers pw-insert-transfers)
from . import mark_static_subgraphs  # noqa: F401  (registers pw-mark-static-subgraphs)
from . import schedule  # noqa: F401  (registers pw-schedule)
from . import verify_schedule  # noqa: F401  (registers pw-verify-schedule)
from . import fuse_island  # noqa: F401  (registers pw-fuse-island)
from . import fuse_launches  # noqa: F401  (registers pw-fuse-launches)
from . import plan_memory  # noqa: F401  (registers pw-plan-memory)
from . import emit_plans  # noqa: F401  (registers pw-emit-plans)
from . import verify_plans  # noqa: F401  (registers pw-verify-plans)
from . import verify_phase  # noqa: F401  (registers pw-verify-phase)
from .lower import LoweringError, TopologyNeeded, load_plans, lower, lower_to_plans  # registers pw-lower

__all__ = ["LoweringError", "TopologyNeeded", "load_plans", "lower", "lower_to_plans", "program_plans"]
