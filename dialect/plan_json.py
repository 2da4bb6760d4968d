"""Reading plans from untrusted JSON values, and writing them as JSON values.

`JsonReader` reads typed fields out of what `json.loads` gave, naming the
path of whatever is wrong in one `PlanError` line; plan.py builds a
`ProgramPlan` with it, and its steps with `step_from_python`.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Callable

from .plan_steps import STEP_KINDS, Step


class PlanError(ValueError):
    """A plan that is malformed or cannot run; the message names the part at fault, and `step` or
    `buffer` its id where one step or buffer is at fault (`pw-verify-plans` reports it at that op)."""

    def __init__(self, message: str, step: int | None = None, buffer: int | None = None):
        super().__init__(message)
        self.step = step
        self.buffer = buffer


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
    """Returns `value` with dataclasses turned into dicts of their fields and tuples into lists, at any
    depth, as JSON has them (`dataclasses.asdict` would copy every value first, at several times the cost)."""
    if isinstance(value, (str, int, float)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if is_dataclass(value):
        return {f.name: jsonable(getattr(value, f.name)) for f in fields(value)}
    return value


def step_to_python(step: Step) -> dict[str, Any]:
    """Returns a step as a JSON-ready dict (compact: default-valued fields are left out)."""
    out: dict[str, Any] = {"kind": step.kind}
    for f in fields(step):
        value = getattr(step, f.name)
        if f.name in ("then_plan", "else_plan"):
            if value is not None:
                out[f.name] = value.to_python()
        elif f.name == "id" or value != f.default:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def step_from_python(value: Any, where: str, read_plan: Callable[[Any, str], Any]) -> Step:
    """Rebuilds a step from `step_to_python` output; `read_plan(value, where)` reads a branch's plans."""
    r = JsonReader(value, where)
    kind = r.str("kind")
    cls = STEP_KINDS.get(kind)
    if cls is None:
        raise PlanError(f"{where}: unknown step kind '{kind}' (one of {', '.join(STEP_KINDS)})")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in value:
            if f.name == "id":
                raise PlanError(f"{where}: missing 'id'")
            continue
        if f.name in ("then_plan", "else_plan"):
            kwargs[f.name] = read_plan(value[f.name], f"{where}.{f.name}")
        elif isinstance(f.default, tuple):
            kwargs[f.name] = r.ints(f.name)
        elif isinstance(f.default, str):
            kwargs[f.name] = r.str(f.name)
        else:
            kwargs[f.name] = r.int(f.name)
    unknown = set(value) - {f.name for f in fields(cls)} - {"kind"}
    if unknown:
        raise PlanError(f"{where}: a '{kind}' step has no field '{sorted(unknown)[0]}'")
    if cls.on_host and ("then_plan" not in kwargs or "else_plan" not in kwargs):
        raise PlanError(f"{where}: a 'cond' step needs then_plan and else_plan")
    return cls(**kwargs)
