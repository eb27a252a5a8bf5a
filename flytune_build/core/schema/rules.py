"""Rules as data: each checks a value, naming the dotted field it fails at, and writes itself as
JSON Schema (draft 07). A table declared once with them gives both its parser and its schema.

Patterns are written once, in the dialect both Python's `re` and JSON Schema read: a rule's
`pattern` must match the whole value, a `forbid` pattern must not match anywhere (so neither needs
`$`, which Python would also let match before a final newline).
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..codec import Fields

MAX_FLOAT = sys.float_info.max


class Rule:
    """A rule: `check` returns the value checked (or what it parses to), `schema` is its JSON Schema."""

    description = ""

    def check(self, value: Any, path: str, f: Fields) -> Any:
        raise NotImplementedError

    def schema(self) -> dict:
        raise NotImplementedError

    def documented(self) -> dict:
        """The schema, with the rule's description."""
        out = self.schema()
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Text(Rule):
    pattern: str | None = None     # the whole value must match
    what: str = ""                 # how an error names the pattern: "must be {what}, not 'x'"
    max_len: int = 256
    min_len: int = 0
    forbid: tuple[tuple[str, str], ...] = ()  # (pattern found anywhere, rule broken; "{value!r}" quotes it)
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> str:
        f.string(value, path, re.compile(self.pattern) if self.pattern else None, self.what, self.max_len)
        if len(value) < self.min_len:
            f.fail(path, "must not be empty" if self.min_len == 1 else f"must be at least {self.min_len} characters")
        for pattern, rule in self.forbid:
            if re.search(pattern, value):
                f.fail(path, rule.format(value=value))
        return value

    def schema(self) -> dict:
        out: dict = {"type": "string", "maxLength": self.max_len}
        if self.min_len:
            out["minLength"] = self.min_len
        if self.pattern:
            out["pattern"] = f"^(?:{self.pattern})$"
        if self.forbid:
            out["not"] = {"anyOf": [{"pattern": p} for p, _ in self.forbid]}
        return out


@dataclass(frozen=True)
class Choice(Rule):
    choices: tuple[str, ...]
    what: str = ""                 # default: "one of a, b, c"
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> str:
        f.string(value, path)
        if value not in self.choices:
            f.fail(path, f"must be {self.what or 'one of ' + ', '.join(self.choices)}, not {value!r}")
        return value

    def schema(self) -> dict:
        return {"enum": list(self.choices)}


@dataclass(frozen=True)
class Integer(Rule):
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> int:
        return f.integer(value, path, self.minimum, self.maximum)

    def schema(self) -> dict:
        out: dict = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclass(frozen=True)
class Number(Rule):
    """A finite number within [minimum, maximum]."""

    minimum: float = -MAX_FLOAT
    maximum: float = MAX_FLOAT
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> float:
        f.number(value, path)
        if not self.minimum <= value <= self.maximum:
            f.fail(path, f"must be between {self.minimum:g} and {self.maximum:g}, not {value!r}")
        return float(value)

    def schema(self) -> dict:
        return {"type": "number", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Boolean(Rule):
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> bool:
        return f.boolean(value, path)

    def schema(self) -> dict:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Scalar(Rule):
    """A JSON scalar: string, finite number, boolean or null."""

    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> Any:
        return f.scalar(value, path)

    def schema(self) -> dict:
        return {"type": ["string", "number", "boolean", "null"], "minimum": -MAX_FLOAT, "maximum": MAX_FLOAT,
                "not": {"type": "number", "minimum": 1, "maximum": 0},
                "$comment": "finite: the bounds refuse infinities, and NaN is the one number >= 1 and <= 0"}


@dataclass(frozen=True)
class Array(Rule):
    item: Rule
    min_items: int = 0
    too_few: str = ""              # the rule broken below min_items
    max_items: int = 100_000
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> list:
        items = f.array(value, path, lambda v, p: self.item.check(v, p, f), self.max_items)
        if len(items) < self.min_items:
            f.fail(path, self.too_few or f"must hold at least {self.min_items} items")
        return items

    def schema(self) -> dict:
        out = {"type": "array", "items": self.item.documented(), "maxItems": self.max_items}
        if self.min_items:
            out["minItems"] = self.min_items
        return out


@dataclass(frozen=True)
class Object(Rule):
    """An object with any keys, each value checked by one rule."""

    values: Rule
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> dict:
        f.mapping(value, path)
        return {k: self.values.check(v, f"{path}.{k}", f) for k, v in value.items()}

    def schema(self) -> dict:
        return {"type": "object", "additionalProperties": self.values.documented()}


@dataclass(frozen=True)
class Either(Rule):
    """A string checked by `text`, or anything else checked by `other` (whose errors name the type)."""

    text: Rule
    other: Rule
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> Any:
        return (self.text if isinstance(value, str) else self.other).check(value, path, f)

    def schema(self) -> dict:
        return {"anyOf": [self.text.documented(), self.other.documented()]}


@dataclass(frozen=True)
class Parsed(Rule):
    """A value another module parses (`parse(value, f, path)`), with the schema its rules imply."""

    parse: Callable[[Any, Fields, str], Any]
    json_schema: Mapping[str, Any]
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> Any:
        return self.parse(value, f, path)

    def schema(self) -> dict:
        return dict(self.json_schema)


@dataclass(frozen=True)
class Key:
    """One key of a table: its rule, whether it must be there, its value when absent."""

    rule: Rule
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class Table(Rule):
    keys: Mapping[str, Key]
    exactly_one: tuple[str, ...] = ()  # the table must hold exactly one of these keys
    description: str = ""

    def check(self, value: Any, path: str, f: Fields) -> dict:
        """The table with each key checked (keys in declaration order), defaults filled in."""
        f.table(value, path, tuple(k for k, key in self.keys.items() if key.required),
                tuple(k for k, key in self.keys.items() if not key.required))
        if self.exactly_one and sum(k in value for k in self.exactly_one) != 1:
            f.fail(path, "must have exactly one of " + " or ".join(f"`{k}`" for k in self.exactly_one))
        return {k: key.rule.check(value[k], f"{path}.{k}" if path else k, f) if k in value else key.default
                for k, key in self.keys.items()}

    def defaults(self) -> dict:
        """The table's values when it is absent."""
        return {k: key.default for k, key in self.keys.items()}

    def schema(self) -> dict:
        props = {}
        for k, key in self.keys.items():
            props[k] = key.rule.documented()
            if key.default is not None:
                props[k]["default"] = key.default
        out = {"type": "object", "additionalProperties": False, "properties": props}
        required = [k for k, key in self.keys.items() if key.required]
        if required:
            out["required"] = required
        if self.exactly_one:
            out["oneOf"] = [{"required": [k]} for k in self.exactly_one]
        return out
