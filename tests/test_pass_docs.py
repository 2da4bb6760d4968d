"""Every pass's docstring example does what it says under pw-opt.

A pass's docstring shows before/after IR (or the error a check reports); a reader runs the before snippet with
`pw-opt --<pass>` and expects the after. Each snippet elides (`...`), so this file keeps each example completed
into a module (`EXAMPLES`), and checks that the module holds the before snippet's ops and that pw-opt's output
holds the after snippet's ops, in order, or reports the errors the docstring quotes. An op of a snippet matches
a printed op of the same kind whose attributes include the snippet's: `...` (or `{...}`) stands for anything,
a dictionary of the snippet may leave keys out, and `: i64` is left off.
"""

import textwrap
from dataclasses import dataclass, field

import pytest

from pathways_mlir.cli import pw_opt
from pathways_mlir.passes.registry import PASSES, PIPELINES

TOPOLOGY_1x4 = ('module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [\n'
                '  {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, '
                'device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {\n')
TOPOLOGY_2x8 = ('module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [\n'
                + ",\n".join(f'  {{name = "{island}", device_kind = "cpu", hosts = 1, devices_per_host = 8, '
                            f'device_memory_bytes = 1024, ici = {{bandwidth_gbps = 100.0, latency_us = 1.0}}}}'
                            for island in ("island0", "island1"))
                + ']}} {\n')
IDENTITY = ('module @{name} attributes {{pw.executable}} {{\n'
            '  func.func @main(%x: {t}) -> {t} {{ return %x : {t} }}\n}}\n')


def identity(name: str, t: str = "tensor<8xf32>") -> str:
    """An executable `@name` that returns its one argument."""
    return IDENTITY.format(name=name, t=t)


def placed(name: str, island: str, begin: int, end: int, axes: str = '["x"]', shape: str = "2") -> str:
    """A slice placed on devices [begin, end) of `island`."""
    return (f'"pw.virtual_slice"() {{sym_name = "{name}", shape = array<i64: {shape}>, axes = {axes}, '
            f'constraints = {{}}, pw.placement = {{island = "{island}", devices = array<i64: {begin}, {end}>}}}} '
            f': () -> ()\n')


def compute(result: str, operand: str, callee: str, slice_: str, sharding: str, label: str, marks: str = "",
            t: str = "tensor<8xf32>") -> str:
    """A `pw.compute` of one operand and one result, both of `sharding`."""
    return (f'  %{result} = "pw.compute"(%{operand}) {{callee = @{callee}, slice = @{slice_}, '
            f'in_shardings = [[{sharding}]], out_shardings = [[{sharding}]], label = "{label}"{marks}}} '
            f': ({t}) -> {t}\n')


def program(body: str, args: str = "%x: tensor<8xf32>", marks: str = "", result: str = "tensor<8xf32>") -> str:
    """A program `@main` with `body`, returning `%ret`."""
    return (f'func.func @main({args}) -> {result} attributes {{pw.program{marks}}} {{\n{body}'
            f'  return %ret : {result}\n}}\n')


@dataclass(frozen=True)
class Example:
    """A docstring example completed into a module: `setup` flags bring it to where the snippet starts (their
    output is what the before snippet shows), `flags` run the pass."""

    module: str
    flags: tuple[str, ...]
    setup: tuple[str, ...] = ()


STATIC = ", pw.subgraphs = [{id = 0, static = true}]"
HOME_A = '%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}'

# One entry per example block of each pass's docstring, in order.
EXAMPLES: dict[str, list[Example]] = {
    "pw-alias-slices": [Example(
        TOPOLOGY_1x4 + placed("a", "island0", 0, 2, '["data"]') + placed("c", "island0", 0, 2) + identity("f")
        + program(compute("ret", "x", "f", "c", '["x"]', "f#0")) + "}\n",
        ("--pw-alias-slices",))],
    "pw-emit-plans": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + placed("b", "island1", 0, 2) + identity("f")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.order = 0, pw.subgraph = 0")
                  + '  %ret = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], '
                    'pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>\n', HOME_A, STATIC) + "}\n",
        ("--pw-emit-plans",))],
    "pw-fuse-island": [Example(
        TOPOLOGY_1x4 + placed("a", "island0", 0, 2, '["d"]') + placed("b", "island0", 0, 4, '["d", "m"]', "2, 2")
        + placed("c", "island0", 2, 4, '["d"]') + identity("f") + identity("g") + identity("h")
        + program(compute("0", "x", "f", "a", '["d"]', "f#0", ", pw.subgraph = 0")
                  + '  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], '
                    'pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} '
                    ': (tensor<8xf32>) -> tensor<8xf32>\n'
                  + compute("2", "1", "g", "b", '["d", "m"]', "g#0", ", pw.subgraph = 0")
                  + '  %3 = "pw.gather"(%2) {src = @b, dst = @c, src_sharding = [["d", "m"]], dst_sharding = [["d"]], '
                    'pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} '
                    ': (tensor<8xf32>) -> tensor<8xf32>\n'
                  + compute("ret", "3", "h", "c", '["d"]', "h#0", ", pw.subgraph = 0"),
                  '%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}', STATIC) + "}\n",
        ("--pw-fuse-island",))],
    "pw-fuse-launches": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + identity("f") + identity("g")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.subgraph = 0")
                  + compute("ret", "0", "g", "a", '["x"]', "g#0", ", pw.subgraph = 0"), HOME_A, STATIC) + "}\n",
        ("--pw-fuse-launches",))],
    "pw-insert-transfers": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + placed("b", "island1", 0, 2) + identity("f")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0") + compute("ret", "0", "f", "b", '["x"]', "f#1"))
        + "}\n",
        ("--pw-insert-transfers",))],
    "pw-mark-static-subgraphs": [Example(
        '"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()\n'
        + identity("f")
        + 'module @positive attributes {pw.executable} {\n  func.func @main(%x: tensor<8xf32>) -> tensor<i1> {\n'
          '    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>\n'
          '    return %0 : tensor<i1>\n  }\n}\n'
        + 'func.func @then(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {\n'
          '  return %x : tensor<8xf32>\n}\n'
        + program('  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], '
                  'out_shardings = [[]], label = "p#0"} : (tensor<8xf32>) -> tensor<i1>\n'
                  '  %y = "pw.cond"(%p, %x) {then_program = @then, else_program = @then, label = "k#0"} '
                  ': (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>\n'
                  + compute("ret", "y", "f", "a", '["x"]', "z#0")),
        ("--pw-mark-static-subgraphs",))],
    "pw-place": [
        Example(
            'module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [\n'
            '  {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, '
            'device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, '
            'unavailable = array<i64: 4, 5, 6, 7>}]}} {\n'
            '"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 8>, axes = ["data"], '
            'constraints = {min_shape = array<i64: 2>}} : () -> ()\n}\n',
            ("--pw-place",)),
        Example(
            '"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()\n'
            '"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()\n',
            ("--pw-place=topology=2x4 strategy=spread",)),
    ],
    "pw-plan-memory": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + identity("f", "tensor<32xf32>")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.order = 0, pw.subgraph = 0", "tensor<32xf32>")
                  + compute("ret", "0", "f", "a", '["x"]', "f#1", ", pw.order = 1, pw.subgraph = 0", "tensor<32xf32>"),
                  '%x: tensor<32xf32> {pw.home = {slice = @a, sharding = [["x"]]}}', STATIC, "tensor<32xf32>")
        + "}\n",
        ("--pw-plan-memory",), setup=("--pw-emit-plans",))],
    "pw-schedule": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + placed("b", "island0", 2, 4)
        + 'module @f attributes {pw.executable} {\n  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {\n'
          '    %0 = "stablehlo.tanh"(%x) : (tensor<8xf32>) -> tensor<8xf32>\n    return %0 : tensor<8xf32>\n  }\n}\n'
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.subgraph = 0")
                  + '  %ret = "pw.transfer"(%0) {link = "ici", src = @a, dst = @b, sharding = [["x"]], '
                    'pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>\n', HOME_A, STATIC) + "}\n",
        ("--pw-schedule",))],
    "pw-verify": [Example(
        '"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()\n'
        + identity("f", "tensor<6xf32>")
        + program('  %ret = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], '
                  'out_shardings = [[[]]], label = "f#0"} : (tensor<6xf32>) -> tensor<6xf32>\n', "%a: tensor<6xf32>",
                  result="tensor<6xf32>"),
        ("--pw-verify",))],
    "pw-verify-phase": [Example(
        '"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()\n',
        ("--pw-verify-phase=phase=placed",))],
    "pw-verify-plans": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + identity("f")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.order = 0, pw.subgraph = 0")
                  + compute("ret", "0", "f", "a", '["x"]', "f#1", ", pw.order = 1, pw.subgraph = 0"), HOME_A, STATIC)
        + 'module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {\n'
        + "".join(f'  "pw.buffer"() {{bytes_per_device = 16, home = {{sharding = [["x"]], slice = @a}}, id = {i}, '
                  f'type = tensor<8xf32>}} : () -> ()\n' for i in range(3))
        + "".join(f'  "pw.launch"() {{after = array<i64{after}>, devices = array<i64: 0, 2>, executable = @f, '
                  f'inputs = array<i64: {read}>, label = "f#{step}", output_bytes = array<i64: 16>, '
                  f'outputs = array<i64: {step + 1}>, slice = @a, step = {step}, subgraph = 0}} : () -> ()\n'
                  for step, read, after in ((0, 0, ""), (1, 7, ": 0")))
        + '}\nmodule @main_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 2>, '
          'program = @main, subgraphs = [{id = 0, static = true}]}} {\n}\n}\n',
        ("--pw-verify-plans",))],
    "pw-verify-schedule": [Example(
        TOPOLOGY_2x8 + placed("a", "island0", 0, 2) + identity("f")
        + program(compute("0", "x", "f", "a", '["x"]', "f#0", ", pw.order = 1, pw.subgraph = 0")
                  + compute("ret", "0", "f", "a", '["x"]', "f#1", ", pw.order = 0, pw.subgraph = 0"), HOME_A, STATIC)
        + "}\n",
        ("--pw-verify-schedule",))],
}


# -- reading snippets ------------------------------------------------------------------------------------

@dataclass
class Block:
    """One example of a docstring: the IR lines before its `// after` line, those after, and the messages of its
    `// error:` lines."""

    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    after_begun: bool = False


def blocks(doc: str) -> list[Block]:
    """The examples of a docstring: each run of lines indented by four spaces."""
    found, current = [], None
    for line in doc.splitlines():
        if not line.startswith("    "):
            current = None
            continue
        if current is None:
            current = Block()
            found.append(current)
        text = line[4:]
        comment = text.strip()
        if comment.startswith("// after"):
            current.after_begun = True
        elif comment.startswith("// error:"):
            current.errors.append(comment.removeprefix("// error:").strip())
        elif comment.startswith("//   ") and current.errors:      # an error message goes on
            current.errors[-1] += " " + comment.removeprefix("//").strip()
        elif not comment.startswith("//"):
            (current.after if current.after_begun else current.before).append(text)
    return found


def _depth(text: str) -> int:
    """Open brackets of `text` outside strings, less the closing ones; a trailing region brace is not counted."""
    text = text.rstrip()
    if text.endswith(" {"):
        text = text[:-2]
    depth, quoted = 0, False
    for c in text:
        if c == '"':
            quoted = not quoted
        elif not quoted:
            depth += c in "([{"
            depth -= c in ")]}"
    return depth


def statements(lines: list[str]) -> list[str]:
    """Joins lines into statements: a line whose brackets stay open continues on the next."""
    out, pending = [], ""
    for line in lines:
        pending = f"{pending} {line.strip()}" if pending else line.strip()
        if pending and _depth(pending) <= 0:
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def _balanced(text: str, start: int) -> str:
    """The bracketed text of `text` that opens at `start`."""
    depth, quoted = 0, False
    for i in range(start, len(text)):
        c = text[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "([{":
            depth += 1
        elif not quoted and c in ")]}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    raise ValueError(f"unbalanced: {text}")


def op_of(statement: str) -> tuple[str, str] | None:
    """(kind, attribute dictionary text) of a statement that is a pw op, or a module or function with attributes;
    None for any other line (`return`, `}`, a declaration)."""
    if '"pw.' in statement:
        name_start = statement.index('"pw.') + 1
        name = statement[name_start:statement.index('"', name_start)]
        operands_end = name_start + len(name) + 1 + len(_balanced(statement, name_start + len(name) + 1))
        brace = statement.find("{", operands_end)
        return name, _balanced(statement, brace) if brace >= 0 else "{}"
    for kind in ("module", "func.func"):
        if statement.startswith(kind + " ") and " attributes {" in statement:
            head = statement[:statement.index(" attributes {")]
            symbol = head.split("@", 1)[1].split("(", 1)[0] if "@" in head else ""
            return f"{kind} @{symbol}", _balanced(statement, statement.index(" attributes {") + len(" attributes "))
    return None


def _split(inner: str) -> list[str]:
    """Splits the inside of a dictionary or list at its top-level commas."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(inner):
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "([{<":
            depth += 1
        elif not quoted and c in ")]}>":
            depth -= 1
        elif not quoted and c == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    return [p for p in parts if p]


def _entries(dictionary: str) -> dict[str, str | None]:
    """The entries of a dictionary's text: key to value text, None for a unit attribute (`pw.executable`)."""
    entries = {}
    for part in _split(dictionary[1:-1]):
        key, _, value = part.partition(" = ")
        entries[key.strip()] = value.strip() if value else None
    return entries


def matches(shown: str, printed: str) -> bool:
    """Whether an attribute value as a snippet shows it matches the printed one."""
    shown, printed = shown.replace(" : i64", "").strip(), printed.replace(" : i64", "").strip()
    if shown in ("...", "{...}"):
        return True
    if shown.startswith("{") and printed.startswith("{"):
        have = _entries(printed)
        return all(key == "..." or (key in have and (value is None) == (have[key] is None)
                                    and (value is None or matches(value, have[key])))
                   for key, value in _entries(shown).items())
    if shown.startswith("[") and printed.startswith("["):
        want, have = _split(shown[1:-1]), _split(printed[1:-1])
        if want and want[-1] == "...":      # the elements shown, then any number
            want = want[:-1]
            have = have[:len(want)]
        return len(want) == len(have) and all(matches(w, h) for w, h in zip(want, have))
    return " ".join(shown.split()) == " ".join(printed.split())


def find_in_order(shown: list[str], printed: list[str]) -> str | None:
    """Returns the first snippet op with no matching printed op after the previous one's match, else None."""
    ops = [op for op in map(op_of, statements(printed)) if op is not None]
    at = 0
    for statement in shown:
        want = op_of(statement)
        if want is None:
            continue
        while at < len(ops) and not (ops[at][0] == want[0] and matches(want[1], ops[at][1])):
            at += 1
        if at == len(ops):
            return statement
        at += 1
    return None


def run_pw_opt(tmp_path, capsys, text: str, flags: tuple[str, ...]) -> tuple[int, str, str]:
    """Runs pw-opt on `text` with `flags`; returns its exit status, output and errors."""
    path = tmp_path / "example.mlir"
    path.write_text(text)
    capsys.readouterr()
    status = pw_opt.main([str(path), *flags])
    out = capsys.readouterr()
    return status, out.out, out.err


# -- the tests -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PASSES) + sorted(PIPELINES))
def test_docstring_says_what_it_requires_and_shows_an_example(name):
    doc = PASSES[name].description() if name in PASSES else PIPELINES[name].description()
    assert "Requires" in doc, f"{name}'s docstring does not say what it requires"
    assert ("// before" in doc and "// after" in doc) or "// error:" in doc, \
        f"{name}'s docstring shows no before/after IR nor an error"


def test_every_pass_has_its_examples_completed_here():
    for name, cls in PASSES.items():
        examples = [b for b in blocks(cls.description()) if any(map(op_of, statements(b.before)))]
        assert len(EXAMPLES.get(name, ())) == len(examples), \
            f"{name}'s docstring has {len(examples)} examples, EXAMPLES completes {len(EXAMPLES.get(name, ()))}"


@pytest.mark.parametrize("name, index", [(n, i) for n, examples in EXAMPLES.items() for i in range(len(examples))])
def test_docstring_example_gives_its_after_snippet(name, index, tmp_path, capsys):
    block = [b for b in blocks(PASSES[name].description()) if any(map(op_of, statements(b.before)))][index]
    example = EXAMPLES[name][index]
    before, after = statements(block.before), statements(block.after)
    status, start, err = run_pw_opt(tmp_path, capsys, example.module, example.setup)
    assert status == 0, err
    missing = find_in_order(before, start.splitlines())
    assert missing is None, f"the completed module of {name}'s example {index} lacks `{missing}`:\n{start}"
    status, out, err = run_pw_opt(tmp_path, capsys, example.module, example.setup + example.flags)
    if block.errors:
        assert status == 1, f"{name}'s example {index} reports no error:\n{out}"
        for message in block.errors:
            assert message in err, f"{name}'s example {index} does not report `{message}`:\n{err}"
        assert err.count(": error: ") == len(block.errors), f"{name}'s example {index} reports more:\n{err}"
        return
    assert status == 0, err
    missing = find_in_order(after, out.splitlines())
    assert missing is None, f"{name}'s example {index} does not give `{missing}`:\n{out}"


def test_matching_reads_elisions_and_finds_a_changed_attribute():
    printed = ['%0 = "pw.compute"(%arg0) {callee = @f, in_shardings = [[["x"]]], pw.cost = {bytes = 32 : i64, '
               'flops = 4 : i64}, slice = @a} : (tensor<8xf32>) -> tensor<8xf32>']
    assert find_in_order(['%0 = "pw.compute"(%x) {slice = @a, pw.cost = {flops = 4, ...}, ...}'], printed) is None
    assert find_in_order(['%0 = "pw.compute"(%x) {slice = @b, ...}'], printed) is not None
    assert find_in_order(['%0 = "pw.compute"(%x) {pw.costs = {...}, ...}'], printed) is not None
    joined = statements(textwrap.dedent("""\
        module @m attributes {pw.fused = {calls = [
            {callee = @f}], results = array<i64: 1>}} {
          func.func private @main(tensor<8xf32>) -> tensor<8xf32>
        }""").splitlines())
    assert op_of(joined[0]) == ("module @m", "{pw.fused = {calls = [ {callee = @f}], results = array<i64: 1>}}")
