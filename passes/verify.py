"""`pw-verify`: the semantic rules of the `pw` dialect.

MLIR checks structure when it parses (operand counts, attribute kinds); this
pass checks meaning, reporting each problem at the op at fault:

- slices: one axis name per mesh dimension, unique, sizes positive, known
  constraints with values of the right kind, an elastic range
  (`min_shape`, `max_shape`) of the shape's rank around it; placements (`pw.placement`)
  that name as many devices as the slice has, on an island of the module's
  `pw.topology` and within its devices when the module has one;
- symbols: every `callee`, `slice`,
  `then_program`, `else_program`, `src` and `dst` resolves to the right kind;
- values: programs and compiled functions take and return tensors of the
  element types plans hold (`dialect/element_types.py`: not `index`, `i128`
  or `tf32`);
- computations: one sharding per operand and result, each naming the slice's
  axes at most once, of the tensor's rank, splitting every dimension evenly;
  operand and result types equal to the compiled function's signature;
- data-dependent steps: a scalar predicate of a boolean, integer or float
  type (true when nonzero, as `jax.lax.cond` reads it), branch programs
  whose signature matches;
- data movement: a known link, shardings valid on both slices, the number of
  pieces and their shape consistent with the two shardings (a one-piece
  gather moves whole shards between axes of other names);
- placement of values: an operand produced by data movement must arrive on
  the slice and in the sharding its consumer uses. (That every operand lives
  where it is used is the lowered phase's rule, checked by pw-verify-phase.)

Requires nothing; changes nothing.

    // pw.compute splits a dimension of size 6 four ways
    "pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
    %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], ...} : (tensor<6xf32>) -> ...
    // error: 'pw.compute' op operand #0 on slice @v0: dimension 0 of size 6 is split 4 ways by [["x"]], which
    //   does not divide it
"""

from __future__ import annotations

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.element_types import ELEMENT_BYTES
from pathways_mlir.dialect.homes import Home, result_homes
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.dialect.topology import TopologyError

from .registry import Pass, register


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_ranked_tensor(type_: ir.Type) -> bool:
    return isinstance(type_, ir.RankedTensorType) and ir.RankedTensorType(type_).has_static_shape


class _Checker:
    """Walks one module, reporting problems to a diagnostic engine."""

    def __init__(self, module: ir.Operation, diagnostics: DiagnosticEngine):
        self.module = module
        self.diagnostics = diagnostics
        self.slices: dict[str, ops.VirtualSlice] = {}
        self.symbols: dict[str, ir.Operation] = {}
        self.entries: dict[str, ir.Operation | None] = {}   # each compiled function's entry, by name
        try:
            self.topology = ops.module_topology(module)
        except TopologyError:
            self.topology = None      # malformed: reported by the passes that read it

    def error(self, op: ir.Operation, message: str) -> None:
        self.diagnostics.error(op, f"'{op.name}' op {message}")

    # -- module level ------------------------------------------------------

    def check_module(self) -> None:
        # MLIR's symbol table has already rejected duplicate names.
        top = list(ops.top_level_ops(self.module))
        self.symbols = {name: op for name, op in ((ops.symbol_name(op), op) for op in top) if name is not None}
        for op in top:
            if ops.SliceOp.isa(op):
                self.check_slice(op)
        self.entries = {ops.symbol_name(op): ops.executable_entry(op) for op in top if ops.is_executable(op)}
        for op in top:
            if ops.is_executable(op) and self.entries[ops.symbol_name(op)] is None:
                self.error(op, "is a compiled function without an entry: it needs one func.func, "
                               "or one named @main")
            elif ops.is_executable(op):
                self.check_element_types(self.entries[ops.symbol_name(op)])
            elif ops.is_program(op):
                self.check_element_types(op)
                blocks = len(op.regions[0].blocks)
                if blocks == 1:
                    self.check_program(op)
                else:
                    what = f"of {blocks} blocks" if blocks else "without a body"
                    self.error(op, f"is a program {what}, but a program is one block of pw ops ending in "
                                   f"func.return")
            elif op.name in ops.PROGRAM_OPS:
                self.error(op, "must be inside a program (a func.func marked pw.program)")
            if not (ops.is_executable(op) or ops.is_plan(op)):
                self.check_nesting(op)

    def check_element_types(self, func: ir.Operation) -> None:
        """Reports the first argument or result of a program or compiled function's entry that is a tensor of an
        element type the plans cannot hold: one not in `element_types.ELEMENT_BYTES` (`index`, `i128`, `tf32`,
        a dialect's type), the table by which placement, memory planning and the runtime size every value.
        Every value of a program is an argument, or has the type of a callee's result or of another value."""
        signature = ops.function_type(func)
        for what, types in (("argument", signature.inputs), ("result", signature.results)):
            for index, type_ in enumerate(types):
                if not isinstance(type_, ir.RankedTensorType):
                    continue
                element = str(ir.RankedTensorType(type_).element_type)
                if element not in ELEMENT_BYTES:
                    self.error(func, f"{what} {index} is {type_}, whose element type {element} is not a pw element "
                                     f"type (known: {', '.join(ELEMENT_BYTES)})")
                    return

    def check_nesting(self, top: ir.Operation) -> None:
        """Reports each pw op and program nested in a top-level op other than directly in a program's body
        (those ops would go unchecked, and lowering would drop them). Executables and plans are not read."""
        def visit(op: ir.Operation) -> ir.WalkResult:
            if op == top:
                return ir.WalkResult.ADVANCE
            if ops.is_program(top) and op.parent == top:
                return ir.WalkResult.SKIP      # the body, checked by check_program
            if op.name.startswith("pw.") or ops.is_program(op):
                self.error(op, f"is nested in '{op.parent.name}', but slices and programs are at the top level "
                               f"of the module, and the other pw ops directly in a program's body")
                return ir.WalkResult.SKIP
            return ir.WalkResult.ADVANCE

        ops.walk(top, visit, ir.WalkOrder.PRE_ORDER)

    def check_slice(self, op: ir.Operation) -> None:
        s = ops.VirtualSlice.from_op(op)
        if not s.shape:
            self.error(op, f"slice @{s.name} has an empty shape")
        if any(d <= 0 for d in s.shape):
            self.error(op, f"slice @{s.name} has a non-positive mesh dimension in shape {list(s.shape)}")
        if len(s.axes) != len(s.shape):
            self.error(op, f"slice @{s.name} has {len(s.shape)} mesh dimensions but "
                           f"{len(s.axes)} axis names")
        if not all(isinstance(a, str) and a for a in s.axes):
            self.error(op, f"slice @{s.name} axis names must be non-empty strings")
        elif len(set(s.axes)) != len(s.axes):
            self.error(op, f"slice @{s.name} repeats an axis name in {list(s.axes)}")
        for key, value in s.constraints.items():
            kind = ops.CONSTRAINT_KINDS.get(key)
            if kind is None:
                self.error(op, f"slice @{s.name} has unknown constraint '{key}' "
                               f"(known: {', '.join(ops.CONSTRAINT_KINDS)})")
            elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                self.error(op, f"slice @{s.name} constraint '{key}' must be a {kind.__name__}")
            elif key == "min_memory_bytes" and value < 0:
                self.error(op, f"slice @{s.name} constraint '{key}' must not be negative, not {value}")
        if s.well_formed and all(isinstance(s.constraints.get(k, ()), tuple) for k in ("min_shape", "max_shape")):
            problem = s.range_problem()
            if problem is not None:
                self.error(op, f"slice @{s.name} {problem}")
        placement = ops.attr(op, ops.PLACEMENT)
        if placement is not None:
            self.check_placement(op, s, placement)
        if s.well_formed:  # what uses a malformed slice is not checked against it
            self.slices[s.name] = s

    def check_placement(self, op: ir.Operation, s: ops.VirtualSlice, placement) -> None:
        if not isinstance(placement, dict) or not isinstance(placement.get("island"), str) \
                or not isinstance(placement.get("devices"), tuple):
            self.error(op, f"slice @{s.name} placement must be {{island = \"name\", devices = array<i64: ...>}}")
            return
        ranges = placement["devices"]
        if len(ranges) % 2 or not all(isinstance(d, int) and not isinstance(d, bool) for d in ranges) \
                or any(b >= e or b < 0 for b, e in zip(ranges[::2], ranges[1::2])):
            self.error(op, f"slice @{s.name} placement devices must be half-open ranges "
                           f"[begin, end) with 0 <= begin < end")
            return
        count = sum(e - b for b, e in zip(ranges[::2], ranges[1::2]))
        if count != s.size:
            self.error(op, f"slice @{s.name} has {s.size} devices but its placement names {count}")
        if self.topology is None:
            return
        names = [i.name for i in self.topology.islands]
        if placement["island"] not in names:
            self.error(op, f"slice @{s.name} is placed on island '{placement['island']}', but the module's "
                           f"pw.topology has no such island (islands: {', '.join(names)})")
            return
        island = self.topology.island(placement["island"])
        if max(ranges[1::2], default=0) > island.num_devices:
            self.error(op, f"slice @{s.name} is placed on devices {list(ranges)} (ranges [begin, end)) of "
                           f"{island.name}, but {island.name} has {island.num_devices} devices")

    # -- programs ----------------------------------------------------------

    def check_program(self, program: ir.Operation) -> None:
        # Where each value lives (dialect.homes), for the ops whose attributes
        # are valid; program arguments and cond results are host values.
        homes: dict[ir.Value, Home | None] = {}
        for arg in ops.program_body(program).arguments:
            homes[arg] = None
        self.check_program_marks(program)
        for op in ops.program_body(program).operations:
            op = op.operation
            self.check_op_marks(op)
            if ops.Compute.isa(op):
                self.check_compute(op, homes)
            elif ops.Cond.isa(op):
                self.check_cond(op)
                for r in op.results:
                    homes[r] = None
            elif ops.DataMovement.isa(op):
                self.check_movement(op, homes)
            elif op.name not in ("func.return",):
                self.error(op, "is not allowed in a pw program")
        body = ops.program_body(program).operations
        if not len(body) or body[len(body) - 1].operation.name != "func.return":
            self.error(program, "is a program whose body does not end with func.return")

    # -- marks that later passes read -------------------------------------

    def check_program_marks(self, program: ir.Operation) -> None:
        subgraphs = ops.attr(program, ops.SUBGRAPHS, [])
        if not (isinstance(subgraphs, list) and all(
                isinstance(g, dict) and _is_int(g.get("id")) and isinstance(g.get("static"), bool) for g in subgraphs)):
            self.error(program, f"'{ops.SUBGRAPHS}' must be a list of {{id = <integer>, static = <bool>}}")
        arg_attrs = ops.attr(program, "arg_attrs") or []
        for i, a in enumerate(arg_attrs):
            if isinstance(a, dict) and ops.HOME in a and not self.is_home(a[ops.HOME]):
                self.error(program, f"argument #{i} has a '{ops.HOME}' that is not {{}} or {{slice, sharding}} "
                                    f"on a slice of this module")
            if isinstance(a, dict) and ops.DONATED in a and a[ops.DONATED] is not None:
                self.error(program, f"argument #{i} has a '{ops.DONATED}' that is not a unit attribute")

    def check_op_marks(self, op: ir.Operation) -> None:
        for mark in (ops.ORDER, ops.SUBGRAPH):
            if mark in op.attributes and not (_is_int(ops.attr(op, mark)) and ops.attr(op, mark) >= 0):
                self.error(op, f"'{mark}' must be a non-negative integer")
        if ops.RESULT_HOMES in op.attributes:
            homes = ops.attr(op, ops.RESULT_HOMES)
            if not (isinstance(homes, list) and len(homes) == len(op.results) and all(map(self.is_home, homes))):
                self.error(op, f"'{ops.RESULT_HOMES}' must hold one {{}} or {{slice, sharding}} per result")

    def is_home(self, value) -> bool:
        """True for a `pw.home` value: {} (the host) or {slice, sharding} on a slice of this module."""
        return isinstance(value, dict) and (not value or (
            set(value) == {"slice", "sharding"} and isinstance(value["slice"], str)
            and value["slice"] in self.slices and Sharding.checked(value["sharding"]) is not None))

    def resolve(self, op: ir.Operation, key: str, kind: str):
        target = ops.attr(op, key)
        found = self.symbols.get(str(target))
        wanted = {
            "slice": lambda o: ops.SliceOp.isa(o),
            "executable": ops.is_executable,
            "program": ops.is_program,
        }[kind]
        if found is None or not wanted(found):
            what = {"slice": "a pw.virtual_slice", "executable": "a compiled function (a module marked pw.executable)",
                    "program": "a program (a func.func marked pw.program)"}[kind]
            self.error(op, f"'{key}' refers to @{target}, which is not {what} in this module")
            return None
        return found

    def check_sharding_list(self, op: ir.Operation, key: str, types, slice_: ops.VirtualSlice,
                            what: str) -> list[Sharding] | None:
        raw = ops.attr(op, key)
        shardings = [Sharding.checked(s) for s in raw] if isinstance(raw, list) else [None]
        if None in shardings:
            self.error(op, f"'{key}' must be a list of shardings, each a list of lists of axis names")
            return None
        if len(shardings) != len(types):
            self.error(op, f"has {len(types)} {what}s but {len(shardings)} entries in '{key}'")
            return None
        ok = True
        for i, (sharding, type_) in enumerate(zip(shardings, types)):
            if not _is_ranked_tensor(type_):
                self.error(op, f"{what} #{i} has type {type_}, but pw values are statically shaped tensors")
                ok = False
                continue
            for problem in sharding.problems(ops.tensor_shape(type_), slice_.axis_sizes):
                self.error(op, f"{what} #{i} on slice @{slice_.name}: {problem}")
                ok = False
        return shardings if ok else None

    def check_compute(self, op: ir.Operation, homes) -> None:
        callee = self.resolve(op, "callee", "executable")
        slice_op = self.resolve(op, "slice", "slice")
        results_home = None
        if slice_op is not None and ops.symbol_name(slice_op) in self.slices:
            s = self.slices[ops.symbol_name(slice_op)]
            ins = self.check_sharding_list(op, "in_shardings", [v.type for v in op.operands], s, "operand")
            outs = self.check_sharding_list(op, "out_shardings", [r.type for r in op.results], s, "result")
            if ins is not None:
                for i, (value, sharding) in enumerate(zip(op.operands, ins)):
                    self.check_operand_home(op, i, homes.get(value), s.name, sharding)
            if outs is not None:
                homes.update((r, Home(s.name, sharding)) for r, sharding in zip(op.results, outs))
                results_home = True
        if results_home is None:
            for r in op.results:
                homes[r] = None
        if callee is not None:
            entry = self.entries[ops.symbol_name(callee)]
            if entry is not None:
                expected = ops.function_type(entry)
                actual = ir.FunctionType.get([v.type for v in op.operands], [r.type for r in op.results])
                if expected != actual:
                    self.error(op, f"has type {actual} but its callee @{ops.symbol_name(callee)} has type {expected}")

    def check_operand_home(self, op: ir.Operation, index: int, home, slice_name: str,
                           sharding: Sharding) -> None:
        if home is None:
            return
        producer_slice, producer_sharding = home
        if producer_slice == slice_name and producer_sharding == sharding:
            return
        producer = ops.producer(op.operands[index])
        if producer is None or not ops.DataMovement.isa(producer):
            return  # device-agnostic IR: pw-insert-transfers moves it later
        self.error(op, f"operand #{index} lives on @{producer_slice} with sharding {producer_sharding}, "
                       f"but the op uses it on @{slice_name} with sharding {sharding}")

    def check_cond(self, op: ir.Operation) -> None:
        pred = op.operands[0].type
        if not (isinstance(pred, ir.RankedTensorType) and ir.RankedTensorType(pred).rank == 0
                and isinstance(ir.RankedTensorType(pred).element_type, (ir.IntegerType, ir.FloatType))):
            self.error(op, f"predicate must be a scalar of a boolean, integer or float type, not {pred}")
        actual = ir.FunctionType.get([v.type for v in list(op.operands)[1:]], [r.type for r in op.results])
        for key in ("then_program", "else_program"):
            program = self.resolve(op, key, "program")
            if program is not None and ops.function_type(program) != actual:
                self.error(op, f"passes {actual} but '{key}' @{ops.symbol_name(program)} "
                               f"has type {ops.function_type(program)}")

    def check_movement(self, op: ir.Operation, homes) -> None:
        a = ops.attrs(op)
        homes[op.results[0]] = None
        if a["link"] not in ops.LINKS:
            self.error(op, f"link must be one of {', '.join(ops.LINKS)}, not '{a['link']}'")
        src_op, dst_op = self.resolve(op, "src", "slice"), self.resolve(op, "dst", "slice")
        if src_op is None or dst_op is None:
            return
        src, dst = self.slices.get(a["src"]), self.slices.get(a["dst"])
        if src is None or dst is None:
            return
        if op.operands[0].type != op.results[0].type:
            self.error(op, f"changes the type from {op.operands[0].type} to {op.results[0].type}")
            return
        keys = ("sharding", "sharding") if op.name == "pw.transfer" else ("src_sharding", "dst_sharding")
        src_sh = self._one_sharding(op, keys[0], op.operands[0].type, src)
        dst_sh = self._one_sharding(op, keys[1], op.results[0].type, dst)
        if src_sh is None or dst_sh is None:
            return
        self.check_operand_home(op, 0, homes.get(op.operands[0]), src.name, src_sh)
        homes.update(zip(op.results, result_homes(op)))
        shape = ops.tensor_shape(op.operands[0].type)
        src_ways, dst_ways = src_sh.ways(src.axis_sizes), dst_sh.ways(dst.axis_sizes)
        if op.name == "pw.transfer":
            if src_sh.shard_shape(shape, src.axis_sizes) != dst_sh.shard_shape(shape, dst.axis_sizes):
                self.error(op, f"keeps sharding {src_sh}, but its shards differ in shape on @{src.name} "
                               f"and @{dst.name}: a pw.scatter or pw.gather is needed")
            return
        if op.name == "pw.scatter" and not dst_ways > src_ways:
            self.error(op, f"scatters {src_ways}-way into {dst_ways}-way: a scatter needs more "
                           f"destination shards than source shards")
            return
        if op.name == "pw.gather" and not dst_ways <= src_ways:
            self.error(op, f"gathers {src_ways}-way into {dst_ways}-way: a gather needs at most as many "
                           f"destination shards as source shards")
            return
        small = dst_sh.shard_shape(shape, dst.axis_sizes) if op.name == "pw.scatter" \
            else src_sh.shard_shape(shape, src.axis_sizes)
        big_ways, small_ways = max(src_ways, dst_ways), min(src_ways, dst_ways)
        if tuple(a["piece_shape"]) != small:
            self.error(op, f"has piece_shape {list(a['piece_shape'])} but the pieces are {list(small)}")
        if big_ways % small_ways == 0 and a["pieces"] != big_ways // small_ways:
            self.error(op, f"has {a['pieces']} pieces per shard but {src_ways}-way to {dst_ways}-way "
                           f"needs {big_ways // small_ways}")

    def _one_sharding(self, op: ir.Operation, key: str, type_: ir.Type, s: ops.VirtualSlice):
        raw = ops.attr(op, key)
        if not _is_ranked_tensor(type_):
            self.error(op, f"moves a {type_}, but pw values are statically shaped tensors")
            return None
        sharding = Sharding.checked(raw)
        if sharding is None:
            self.error(op, f"'{key}' must be a list of lists of axis names")
            return None
        problems = sharding.problems(ops.tensor_shape(type_), s.axis_sizes)
        for problem in problems:
            self.error(op, f"'{key}' on slice @{s.name}: {problem}")
        return None if problems else sharding


def verify_module(module: ir.Operation, diagnostics: DiagnosticEngine) -> bool:
    """Checks the semantic rules of pw IR (see the module docstring); True if no error was reported."""
    errors = diagnostics.error_count
    _Checker(module, diagnostics).check_module()
    return diagnostics.error_count == errors


@register
class VerifyPass(Pass):
    __doc__ = __doc__
    name = "pw-verify"
    summary = "Check the semantic rules of the pw dialect (symbols, shardings, placement of values)"
    changes_ir = False
    boundary_check = True

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        verify_module(module, diagnostics)
