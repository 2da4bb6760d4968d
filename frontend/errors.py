"""Errors the front end raises for programs it cannot place, and the check of its boolean arguments."""

from typing import Any


class PlacementError(ValueError):
    """A placed-function call that cannot run where it is placed.

    The message names the Python call at fault (`name at file:line`): an
    unknown axis name, a sharding that does not divide a dimension, specs that
    do not match the arguments, or a value used on a slice it was not sent to.
    """


def require_bool(api: str, name: str, value: Any) -> None:
    """Raises a one-line TypeError naming `api` and the parameter `name` unless `value` is True or False: any
    truthy value would be read as True, and "false" turn an option on."""
    if not isinstance(value, bool):
        raise TypeError(f"{api}: {name} must be True or False, not {value!r:.40}")
