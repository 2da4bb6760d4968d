"""Orbax saves a handle as the JAX array it refers to, reading its value once.

A handle (an array's or a key handle) is a `jax.Array`
(`runtime/array_reference.py`), so Orbax's checkpointers
(`ocp.PyTreeCheckpointer`, `ocp.StandardCheckpointer`, their `args` under a
`CheckpointManager`, and the v1 API: `ocp.v1.save_pytree`, `ocp.v1.save`, ...)
save it with their `jax.Array` type handler, and restore
it as a JAX array laid out as saved. That handler reads
an array's `sharding` and shards nine times in a save; a reference's are its
value's, and a handle of a service or of another process's island fetches the
whole value for each. `register_with_orbax` puts a wrapper in its place
(`_OfValues`) that gives it each reference's JAX array (`result()`), read once;
for a JAX array, and to restore, it is Orbax's handler. The v1 API makes its
own handler for each save rather than take the registry's, so the function
that makes it returns the wrapper too.

Orbax is an optional dependency, imported in 0.2 s here, so it is not imported
for this: the registration happens when `orbax.checkpoint` is imported, at
once if it already is, else right after its import (`_AfterImport`, a finder on
`sys.meta_path` that wraps the module's loader, and goes once the module has run).
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import warnings

ORBAX = "orbax.checkpoint"


def register_with_orbax(kind: type) -> None:
    """Makes Orbax's `jax.Array` type handler save instances of `kind` (those that are `jax.Array`s) as their
    values, each read once, once `orbax.checkpoint` is imported (now, if it is)."""
    if ORBAX in sys.modules:
        _register(kind)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(kind))


def _register(kind: type) -> None:
    """Puts `_OfValues` in place of Orbax's `jax.Array` handler; an Orbax whose registry is not as this one
    knows it gets a warning, never an error in its import."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)    # registering warns that it overrides `jax.Array`'s handler
    try:
        import jax
        from orbax.checkpoint import type_handlers

        # In `jax.Array`'s place, not beside it for `kind` only: Orbax saves each handler's values as one batch,
        # whose array metadata file a second batch would overwrite.
        handler = _OfValues(type_handlers.get_type_handler(jax.Array), kind)
        type_handlers.register_type_handler(jax.Array, handler, override=True)
        _wrap_v1_array_handlers(kind)
    except Exception as error:  # noqa: BLE001  (Orbax's own import must not fail for this)
        warnings.warn(f"Orbax's checkpointers will read each pathways_mlir handle's value several times a save: "
                      f"{error}", stacklevel=2)
    finally:
        absl.setLevel(level)


def _wrap_v1_array_handlers(kind: type) -> None:
    """Makes the v1 API's `jax.Array` handlers `_OfValues` too. Its `ArrayLeafHandler` makes its own for each
    save with `get_array_handler` of a private module (Orbax 0.12), never from the registry: that function,
    looked up in its module at each call, is the one place to wrap."""
    try:
        from orbax.checkpoint.experimental.v1._src.serialization import registration
    except ImportError:     # an Orbax without the module (no v1 API, or one laid out otherwise) saves as it would
        return
    make_handler = registration.get_array_handler

    def get_array_handler(context):
        return _OfValues(make_handler(context), kind)

    registration.get_array_handler = get_array_handler


class _OfValues:
    """An Orbax type handler (every attribute is `handler`'s) that saves each instance of `kind` as its JAX
    array, read once; for every other value (a `jax.Array`), and to restore, it is `handler`."""

    def __init__(self, handler, kind: type):
        self.handler, self.kind = handler, kind

    async def serialize(self, values, infos, args=None):
        """Saves `values`, each reference as its value (`result()`), with `handler`."""
        values = [v.result() if isinstance(v, self.kind) else v for v in values]
        return await self.handler.serialize(values, infos, args)

    def __getattr__(self, name: str):
        return getattr(self.handler, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `orbax.checkpoint` as the other finders on `sys.meta_path` do, with a loader that registers `kind`
    once the module has run and then takes this finder off the path. A lookup that imports nothing
    (`importlib.util.find_spec`, as a library checks for an optional dependency) leaves it there."""

    def __init__(self, kind: type):
        self.kind = kind

    def find_spec(self, name, path=None, target=None):
        if name != ORBAX:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader, self)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """The module's own loader (every other attribute is its), registering `finder.kind` after the module ran."""

    def __init__(self, loader, finder: _AfterImport):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        _register(self.finder.kind)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)
