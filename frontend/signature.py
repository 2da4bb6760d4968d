"""How a placed function or program takes its arguments, as `jax.jit` does.

`static_argnums`/`static_argnames` name arguments that are Python values
baked into the trace (hashable; one compiled signature per value, cached);
`donate_argnums`/`donate_argnames` name arguments whose buffers the call
may reuse. Numbers and names are reconciled through the function's
signature as in `jax.jit`: a static or donated positional parameter is also
static or donated when passed by name, and the other way round. The traced
arguments of a call are the pytree `(args, kwargs)` with the static ones
taken out, as in `jax.jit`'s `in_tree`.

A static value is kept as a `StaticValue`: equal to another only if both
are of one type, as `jax.jit` keys its cache (`1`, `True` and `1.0` are
equal in Python, but each traces its own code). A function with `*args`
takes static numbers past its named parameters, and a negative number
counts from the end of each call's positional arguments; one with
`**kwargs` takes any static name, as `jax.jit` does.

    signature = Signature(fn, "f", static_argnums=1)
    call = signature.split((x, 3), {})       # call.args == (x,), call.static == (((1, StaticValue(3)),), ())
    signature.bound(call.static)(x)          # fn(x, 3)
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import jax

from pathways_mlir.runtime.array_reference import Reference

# jax.jit options that have no meaning for a placed function or program, and why.
_NOT_SUPPORTED = {
    "in_shardings": "shard arguments with in_specs over the slice's axis names",
    "out_shardings": "shard results with out_specs over the slice's axis names",
    "device": "a placed function runs on its virtual slice",
    "backend": "a placed function runs on its virtual slice",
    "keep_unused": "compiled functions always keep every argument",
    "inline": "a placed function is one pw.compute, never inlined",
    "abstracted_axes": "shapes are static in pw IR",
    "compiler_options": "XLA options are not passed through to the islands",
}


class StaticValue:
    """A static argument's value in a cache key: equal to another only if both are of one type and equal, as
    `jax.jit` compares static arguments; a comparison that raises is one ValueError, as in `jax.jit`."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: Hashable):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not StaticValue or type(self.value) is not type(other.value):
            return False
        try:
            return bool(self.value == other.value)
        except Exception as error:  # noqa: BLE001  (whatever the user's __eq__ raises)
            raise ValueError(f"static arguments should be comparable using __eq__: comparing two "
                             f"{type(self.value).__name__} values raised {type(error).__name__}: {error}") from None

    def __repr__(self) -> str:
        return f"StaticValue({self.value!r})"


class BindsAsMethod:
    """A placed function or program defined in a class body is a method, as a `jax.jit` function is: read from
    an instance, it takes the instance as its first argument (static, say, with `static_argnums=0`)."""

    def __get__(self, instance, owner=None):
        return self if instance is None else types.MethodType(self, instance)


def check_options(where: str, options: dict) -> None:
    """Raises a one-line TypeError for `jax.jit` options that `where` does not take."""
    for name in options:
        if name in _NOT_SUPPORTED:
            raise TypeError(f"{where} does not take jax.jit's {name}=: {_NOT_SUPPORTED[name]}")
        raise TypeError(f"{where} got an unexpected keyword argument '{name}'")


def _ints(value: int | Iterable[int] | None) -> tuple[int, ...]:
    """An int or ints (a NumPy integer is one, as `jax.jit` takes it: `operator.index`) as a tuple."""
    if value is None:
        return ()
    try:
        return operator.index(value),
    except TypeError:
        return tuple(map(operator.index, value))


def _strs(value: str | Iterable[str] | None) -> tuple[str, ...]:
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)


def argument_name(path: tuple) -> str:
    """Names a leaf of a call's `(args, kwargs)` by its key path: `argument[1]['w']` for one of the second
    positional argument, `argument['lr']` for the keyword argument `lr` (the pair's own level left out)."""
    return f"argument{jax.tree_util.keystr(tuple(path[1:]))}"


@dataclass(frozen=True)
class Call:
    """One call's arguments: the traced pytree `(args, kwargs)` and the static values."""

    args: tuple
    kwargs: dict
    static: Hashable          # ((position, value), ...), ((name, value), ...)

    @property
    def tree(self) -> tuple:
        """The traced arguments, as the pytree a trace takes."""
        return self.args, self.kwargs


class Signature:
    """The static and donated arguments of `fn`, by position and by name; see the module."""

    def __init__(self, fn: Callable, where: str, static_argnums=None, static_argnames=None,
                 donate_argnums=None, donate_argnames=None):
        self.fn = fn
        self.where = where
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):          # a builtin or C function: numbers and names as given
            parameters = []
        positional = [p.name for p in parameters
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        by_name = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        any_positional = not parameters or any(p.kind is p.VAR_POSITIONAL for p in parameters)
        any_name = not parameters or any(p.kind is p.VAR_KEYWORD for p in parameters)

        def resolve(kind: str, nums, names) -> tuple[frozenset[int], frozenset[str]]:
            nums, names = _ints(nums), _strs(names)
            for n in nums:
                if not any_positional and not -len(positional) <= n < len(positional):
                    raise ValueError(f"{where}: {kind}_argnums {n} is not a positional parameter of "
                                     f"{fn.__name__}{inspect.signature(fn)}")
            for name in names:
                if not any_name and name not in by_name:
                    raise ValueError(f"{where}: {kind}_argnames '{name}' is not a parameter of "
                                     f"{fn.__name__}{inspect.signature(fn)}")
            nums = {n if any_positional else n % len(positional) for n in nums}    # (see `_positions`)
            # A positional-only parameter has no name a call can pass (one that `**kwargs` takes is another).
            nums |= {positional.index(name) for name in names if name in positional and name in by_name}
            names = set(names) | {positional[n] for n in nums if 0 <= n < len(positional) and positional[n] in by_name}
            return frozenset(nums), frozenset(names)

        self._positional = positional
        self._keywords, self._any_keyword = frozenset(by_name), any_name
        self.static_nums, self.static_names = resolve("static", static_argnums, static_argnames)
        self.donate_nums, self.donate_names = resolve("donate", donate_argnums, donate_argnames)
        self._from_end = any(n < 0 for n in self.static_nums | self.donate_nums)
        both = (self.static_nums & self.donate_nums) or (self.static_names & self.donate_names)
        if both:
            raise ValueError(f"{where}: argument {sorted(both)[0]!r} is both static and donated")
        self._bound: dict[Hashable, Callable] = {}

    def takes_keyword(self, name: str) -> bool:
        """Whether `fn` takes a keyword argument `name` (a parameter of that name, or `**kwargs`)."""
        return self._any_keyword or name in self._keywords

    def split(self, args: tuple, kwargs: dict) -> Call:
        """Takes the static arguments out of a call; raises ValueError, as `jax.jit` does, if one is not hashable.

        Keyword arguments for positional parameters right after the given
        positional ones become positional, so `f(x, y=y)` is `f(x, y)` (not
        for a positional-only one: its name is `**kwargs`'s, as in Python).
        """
        if kwargs:
            args, kwargs = list(args), dict(kwargs)
            for name in self._positional[len(args):]:
                if name not in kwargs or name not in self._keywords:
                    break
                args.append(kwargs.pop(name))
        if not self.static_nums and not self.static_names:
            return Call(tuple(args), dict(kwargs), ((), ()))
        nums = self._positions(self.static_nums, len(args))
        static_args = tuple((i, self._static(f"position {i}", a)) for i, a in enumerate(args) if i in nums)
        static_kwargs = tuple((k, self._static(f"'{k}'", v)) for k, v in
                              sorted(((k, v) for k, v in kwargs.items() if k in self.static_names),
                                     key=lambda item: item[0]))
        return Call(tuple(a for i, a in enumerate(args) if i not in nums),
                    {k: v for k, v in kwargs.items() if k not in self.static_names},
                    (static_args, static_kwargs))

    def _static(self, what: str, value: Any) -> StaticValue:
        """`value` as static argument `what`; ValueError, as `jax.jit` raises, if it cannot be one."""
        if isinstance(value, Reference):       # hashable by identity: each new one would trace again
            raise ValueError(f"{self.where}: static argument {what} is a {type(value).__name__}, an array on "
                             f"devices, which jax.jit refuses as not hashable: pass it as a traced argument, or "
                             f"its Python value (int(h), float(h), h.tolist())")
        try:
            return StaticValue(value)            # (hashes it)
        except TypeError:
            raise ValueError(f"{self.where}: static argument {what} is a {type(value).__name__}, which "
                             f"is not hashable: static arguments must be hashable, as with jax.jit") from None

    def _positions(self, nums: frozenset[int], count: int) -> frozenset[int]:
        """`nums` as positions in a call of `count` positional arguments: a negative number (kept as given for a
        function with `*args`) counts from the end of the call's arguments, as in `jax.jit`."""
        if not self._from_end:
            return nums
        return frozenset(n + count if n < 0 else n for n in nums)

    def bound(self, static: Hashable) -> Callable:
        """Returns `fn` of the traced arguments only, with `static`'s values put back (one per value)."""
        if static == ((), ()):
            return self.fn
        if static not in self._bound:
            static_args, static_kwargs = static
            by_position = {i: value.value for i, value in static_args}
            by_name = {k: value.value for k, value in static_kwargs}

            def call(*args, **kwargs):
                rest = iter(args)
                merged = [by_position[i] if i in by_position else next(rest)
                          for i in range(len(args) + len(by_position))]
                return self.fn(*merged, **kwargs, **by_name)
            self._bound[static] = functools.wraps(self.fn)(call)
        return self._bound[static]

    def eval_shape(self, args: tuple, kwargs: dict) -> Any:
        """Returns the `jax.ShapeDtypeStruct`s of `fn`'s results for these arguments, running nothing, as
        `jax.jit(fn).eval_shape` does (placed functions inside trace as their functions)."""
        call = self.split(args, kwargs)
        return jax.eval_shape(self.bound(call.static), *call.args, **call.kwargs)

    def donated(self, call: Call) -> tuple[bool, ...]:
        """Whether each leaf of `call.tree` is donated."""
        static_positions = {p for p, _ in call.static[0]}
        count = len(call.args) + len(static_positions)
        donated = self._positions(self.donate_nums, count)
        positions = [p for p in range(count) if p not in static_positions]
        args = [jax.tree.map(lambda _, d=positions[i] in donated: d, a) for i, a in enumerate(call.args)]
        kwargs = {k: jax.tree.map(lambda _, d=k in self.donate_names: d, v) for k, v in call.kwargs.items()}
        return tuple(jax.tree.leaves((args, kwargs)))
