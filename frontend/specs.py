"""Partition specs: how a placed function shards its inputs and outputs.

`in_specs` and `out_specs` are pytree prefixes of a placed function's
arguments and results whose leaves are `jax.sharding.PartitionSpec`s over the
slice's axis names, or None for replicated (a single spec applies to every
array, as with `jax.jit`'s shardings). A spec entry is an axis name, a tuple
of axis names (the dimension is split over all of them, major first) or None;
a spec shorter than the array's rank leaves the remaining dimensions whole.
This module turns them into one pw `Sharding` per array, checking that every
axis exists and every split divides its dimension.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec

from pathways_mlir.dialect.sharding import Sharding, zero_size

from .avals import format_aval, wire_aval
from .errors import PlacementError
from .provenance import Site
from .slices import Slice


def shardings(specs: Any, tree: Any, kind: str, site: Site, slice_: Slice,
              slice_name: str) -> list[Sharding]:
    """Returns the sharding of each leaf of `tree`, a pytree of abstract values.

    `kind` is "in" (the leaves are the arguments) or "out" (the results).
    Raises `PlacementError` naming `site` when the specs do not fit.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [_sharding(spec, path, aval, kind, site, slice_, slice_name)
            for spec, (path, aval) in zip(_per_leaf(specs, tree, kind, site), leaves)]


def explicit_types(leaf_shardings: list[Sharding], slice_: Slice) -> tuple[PartitionSpec, ...]:
    """The sharding in the types of values laid out as `leaf_shardings` on `slice_` (JAX's explicit sharding
    mode): each one's `PartitionSpec` over the slice's `Explicit` axes only (its `Auto` axes are XLA's to
    use as it chooses, as `jax.jit`'s are); () if the slice has none."""
    explicit = slice_.explicit_axes
    if not explicit:
        return ()

    def entry(axes: tuple[str, ...]):
        kept = tuple(a for a in axes if a in explicit)
        return kept[0] if len(kept) == 1 else (kept or None)
    return tuple(PartitionSpec(*map(entry, sharding.dims)) for sharding in leaf_shardings)


def is_spec(x: Any) -> bool:
    """Whether `x` is one spec (a PartitionSpec or None) rather than a pytree of them."""
    return x is None or isinstance(x, PartitionSpec)


def _per_leaf(specs: Any, tree: Any, kind: str, site: Site) -> list[Any]:
    """Broadcasts a pytree prefix of specs to one spec per leaf of `tree`."""
    tree_util = jax.tree_util
    try:
        expanded = tree_util.tree_map(lambda spec, sub: [spec] * len(tree_util.tree_leaves(sub)),
                                      specs, tree, is_leaf=is_spec)
    except ValueError:
        raise PlacementError(f"{site}: {_difference(specs, tree, kind)}") from None
    return tree_util.tree_leaves(expanded, is_leaf=is_spec)


def _difference(specs: Any, tree: Any, kind: str) -> str:
    """Says where the pytree of `kind` ("in" or "out") specs `specs` first stops being a prefix of `tree`, the
    arguments or results, what each has there, and what to pass instead."""
    # (where JAX refuses trees this walk finds no difference in, the message names the whole trees' types)
    path, spec_node, node = _first_difference(specs, tree, ()) or ((), specs, tree)
    same_type = type(spec_node) is type(node)
    what = "arguments" if kind == "in" else "results"
    if not path:
        value_is = f"the {what} are"
    elif kind == "in":
        value_is = f"argument {path[0].idx}{jax.tree_util.keystr(path[1:])} is"
    else:
        value_is = f"result{jax.tree_util.keystr(path)} is"
    return (f"{kind}_specs{jax.tree_util.keystr(path)} is {_node_kind(spec_node, same_type)}, but {value_is} "
            f"{_node_kind(node, same_type)}: give a pytree prefix of the {what} (one spec per {what[:-1]}, or "
            f"specs in its own structure, as `jax.tree.map(lambda a: P(...), {what[:-1]})` makes them for an NNX "
            f"module too) or one PartitionSpec for all")


def _first_difference(specs: Any, tree: Any, path: tuple) -> tuple[tuple, Any, Any] | None:
    """The first key path (under `path`) where the pytree `specs`, whose leaves are specs, and `tree` have nodes
    of different types or children, with their subtrees there; None where `specs` is a prefix of `tree`."""
    tree_util = jax.tree_util
    if is_spec(specs) or tree_util.treedef_is_leaf(tree_util.tree_structure(specs)):
        return None
    spec_children, spec_node = _one_level(specs)
    children, node = _one_level(tree)
    if spec_node != node:
        return path, specs, tree
    for (key, spec_child), (_, child) in zip(spec_children, children):
        found = _first_difference(spec_child, child, path + (key,))
        if found is not None:
            return found
    return None


def _one_level(tree: Any) -> tuple[list[tuple[Any, Any]], jax.tree_util.PyTreeDef]:
    """The children of the root of `tree` with their keys, and the root's structure with its children as
    leaves (which compares the root's type and its own data: dict keys, a module's graph)."""
    children, structure = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda child: child is not tree)
    if jax.tree_util.treedef_is_leaf(structure):        # (an array: no children)
        return [], structure
    return [(path[0], child) for path, child in children], structure


def _node_kind(x: Any, same_type: bool) -> str:
    """Names what `x` is in a message: its type, and how many entries or which keys it has where the other side
    of the comparison has a node of the same type (`same_type`)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return format_aval(x)
    if x is None:
        return "None"
    name = type(x).__name__
    kind = f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"
    if not same_type:
        return kind
    keys = [jax.tree_util.keystr((key,)) for key, _ in _one_level(x)[0]]
    if isinstance(x, (tuple, list)):
        return f"{kind} of {len(keys)}"
    return f"{kind} with entries {', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''}"


def _sharding(spec: Any, path: tuple, aval: jax.ShapeDtypeStruct, kind: str, site: Site,
              slice_: Slice, slice_name: str) -> Sharding:
    what = f"{'input' if kind == 'in' else 'output'}{jax.tree_util.keystr(path)} {format_aval(aval)}"
    if not is_spec(spec):
        raise PlacementError(f"{site}: {kind}_specs entry for {what} must be a PartitionSpec or None, "
                             f"not {type(spec).__name__} {spec!r}")
    entries = tuple(spec or ())
    if len(entries) > len(aval.shape):
        raise PlacementError(f"{site}: {what} has rank {len(aval.shape)} but its spec {spec} has "
                             f"{len(entries)} entries")
    dims = []
    for entry in entries:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        if not isinstance(axes, tuple) or not all(isinstance(a, str) for a in axes):
            raise PlacementError(f"{site}: {what} has spec {spec} whose entry {entry!r} is not an axis "
                                 f"name, a tuple of axis names or None")
        dims.append(axes)
    shape = wire_aval(aval).shape       # a typed key's data has its key's shape, then unsharded dims
    if zero_size(shape):
        return Sharding.replicated(len(shape))
    sharding = Sharding(tuple(dims) + ((),) * (len(shape) - len(dims)))
    problems = sharding.problems(shape, slice_.axis_sizes)
    if problems and slice_.elastic and slice_.declared(slice_name).shapes([(shape, sharding)]):
        problems = []                   # a smaller shape in the slice's range divides it (see `finish`)
    if problems:
        raise PlacementError(f"{site}: {what} with spec {spec} on slice @{slice_name}: {problems[0]}")
    return sharding
