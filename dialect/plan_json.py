"""Reading plans from untrusted JSON values, and writing them as JSON values.

`JsonReader` reads typed fields out of what `json.loads` gave, naming the
path of whatever is wrong in one `PlanError` line; plan.py builds a
`ProgramPlan` with it.
"""

from __future__ import annotations

from typing import Any


class PlanError(ValueError):
    """A plan that is malformed or cannot run; the message names the part at fault."""


class JsonReader:
    """Reads typed fields out of untrusted JSON, naming the path of whatever is wrong."""

    def __init__(self, value: Any, where: str, kind: type = dict):
        if not isinstance(value, kind):
            raise PlanError(f"{where}: expected {_KIND_NAMES.get(kind, kind.__name__)}, got "
                            f"{type(value).__name__}")
        self.value = value
        self.where = where

    def sub(self, value: Any, key: str, kind: type) -> "JsonReader":
        """Returns a reader of `value`, field `key` of this one, which must be of `kind`."""
        return JsonReader(value, f"{self.where}.{key}", kind)

    def get(self, key: str, kind, default: Any = ...):
        """Returns field `key`, of `kind` (a type or a tuple of types); `default` if it is missing, if given."""
        if key not in self.value:
            if default is not ...:
                return default
            raise PlanError(f"{self.where}: missing '{key}'")
        value = self.value[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise PlanError(f"{self.where}.{key}: expected {_KIND_NAMES.get(kinds[0], kinds[0].__name__)}, got "
                            f"{type(value).__name__}")
        return value

    def str(self, key: str) -> str:
        """Returns string field `key`."""
        return self.get(key, str)

    def int(self, key: str) -> int:
        """Returns integer field `key`."""
        return self.get(key, int)

    def ints(self, key: str) -> tuple[int, ...]:
        """Returns field `key`, a list of integers."""
        return self.sub(self.get(key, list), key, list).ints_of(self.value[key])

    def strs(self, key: str) -> tuple[str, ...]:
        """Returns field `key`, a list of strings."""
        return self.strs_of(self.get(key, list), key)

    def ints_of(self, items: list) -> tuple[int, ...]:
        """Returns `items` (a list read from this reader's value) if they are all integers."""
        if any(not isinstance(i, int) or isinstance(i, bool) for i in items):
            raise PlanError(f"{self.where}: expected a list of integers")
        return tuple(items)

    def strs_of(self, items: list, key: str = "") -> tuple[str, ...]:
        """Returns `items` (a list read from this reader's value, or its field `key`) if they are all strings."""
        if any(not isinstance(i, str) for i in items):
            raise PlanError(f"{self.where}{'.' + key if key else ''}: expected a list of strings")
        return tuple(items)


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "a boolean"}


def jsonable(value: Any) -> Any:
    """Returns `value` with tuples (nested in lists and dicts) turned into lists, as JSON has them."""
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value
