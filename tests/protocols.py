"""Checking that an object implements a declared interface (a `typing.Protocol`), member by member."""

import inspect

import pytest


def declared_methods(protocol) -> dict:
    """The protocol's methods (its properties and attributes are checked on instances)."""
    return {name: member for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def check_implements(instance, protocol) -> None:
    assert isinstance(instance, protocol), f"{type(instance).__name__} lacks a member of {protocol.__name__}"
    for name, declared in declared_methods(protocol).items():
        wanted = list(inspect.signature(declared).parameters.values())[1:]        # without self
        have = inspect.signature(getattr(instance, name)).parameters
        try:     # the declared call binds: positional parameters by position, optional ones by name
            inspect.signature(getattr(instance, name)).bind(
                *[None for p in wanted if p.default is inspect.Parameter.empty],
                **{p.name: p.default for p in wanted if p.default is not inspect.Parameter.empty})
        except TypeError as error:
            pytest.fail(f"{type(instance).__name__}.{name}{inspect.signature(getattr(instance, name))} does not "
                        f"take {protocol.__name__}.{name}'s parameters: {error}")
        assert set(have) >= {p.name for p in wanted if p.default is not inspect.Parameter.empty}
