"""Canonical JSON and a strict reader shared by artifacts, manifests and the scratch cache."""
from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from .errors import FlytuneError

FLOAT_MAX = sys.float_info.max  # a JSON number past it is no measurement: float() of it raises or is inf

MAX_DOCUMENT_BYTES = 1 << 20  # one artifact with hundreds of candidate timings stays far below this

# `module:function`, dotted ASCII names (in the dialect both `re` and JSON Schema read): a tuning plan
# entry's `reference`, the provenance that names it, and `flytune harvest`'s compile entry
FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


# one encoder for every call (json.dumps builds a new one per call with these options); only
# JSON trees are encoded here, never cyclic objects, so the cycle check is skipped
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            check_circular=False)


def canonical(obj: Any) -> bytes:
    """Sorted keys, fixed separators, UTF-8, no NaN/Infinity."""
    return _ENCODER.encode(obj).encode("utf-8")


class _Duplicate(Exception):
    def __init__(self, key: str):
        self.key = key


class _NonFinite(Exception):
    def __init__(self, token: str):
        self.token = token


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _constant(token):
    raise _NonFinite(token)


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def too_long(e: ValueError) -> str:
    """What Python's refusal to read a very long integer literal (a ValueError) means to whoever wrote it."""
    if "integer string conversion" in str(e):
        return (f"it holds an integer of more than {sys.get_int_max_str_digits()} digits, which no field takes "
                f"(every count and size fits in 64 bits)")
    return str(e)


def loads(data: bytes, *, file: object, error: type[FlytuneError],
          max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse JSON strictly; every failure is `error` naming `file` and the rule."""
    if len(data) > max_bytes:
        raise error(f"is {len(data)} bytes, over the {max_bytes}-byte cap", file=file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"is not valid UTF-8 (byte {e.start})", file=file) from None
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
    except _Duplicate as e:
        raise error("is a duplicate JSON key", file=file, field=e.key) from None
    except _NonFinite as e:
        raise error(f"is not valid JSON: non-finite number {e.token!r} is not allowed", file=file) from None
    except json.JSONDecodeError as e:
        # some of json's messages end in "at" ("Unterminated string starting at"): one "at" before the place
        raise error(f"is not valid JSON: {e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno}",
                    file=file) from None
    except RecursionError:
        raise error("is not valid JSON: nested too deeply", file=file) from None
    except ValueError as e:  # e.g. an integer literal beyond Python's digit limit
        raise error(f"is not valid JSON here: {too_long(e)}", file=file) from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        where = lone_surrogate(doc)
        if where is not None:
            raise error("holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): not text",
                        file=file, field=where)
    return doc


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(doc: Any) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, which no UTF-8 text can
    (JSON's `\\ud800` escape parses to one); None when there is none."""
    stack = [(doc, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "<document>"
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, f"{path}.<key>" if path else "<key>"))
                stack.append((v, f"{path}.{k}" if path else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return None


def loads_canonical(data: bytes, *, file: object, error: type[FlytuneError],
                    max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse a document that must be canonical JSON plus one newline.

    A canonical document has no duplicate keys and no NaN, so the fast C parser suffices when the
    bytes round-trip; anything else is re-read strictly to name the exact rule it breaks.
    """
    if len(data) > max_bytes:
        raise error(f"is {len(data)} bytes, over the {max_bytes}-byte cap", file=file)
    try:
        doc = json.loads(data)
        if canonical(doc) + b"\n" == data:
            return doc
    except (ValueError, RecursionError):
        pass
    doc = loads(data, file=file, error=error, max_bytes=max_bytes)  # raises the precise error, if any
    raise NotCanonical(doc)


class NotCanonical(Exception):
    """Raised by `loads_canonical` for a valid document whose bytes are not canonical; carries it."""

    def __init__(self, doc):
        self.doc = doc


JSON_SCALARS = (str, int, float, bool, type(None))


class Fields:
    """Typed field checks for one document: each failure names the file and the JSON path."""

    def __init__(self, file: object, error: type[FlytuneError], root: str = ""):
        self.file = file
        self.error = error
        self.root = root

    def path(self, *parts: str | int) -> str:
        out = self.root
        for p in parts:
            if isinstance(p, int):
                out += f"[{p}]"
            else:
                out = f"{out}.{p}" if out else p
        return out

    def fail(self, path: str, rule: str):
        raise self.error(rule, file=self.file, field=path or "<document>")

    def table(self, value: Any, path: str, required: tuple[str, ...] = (),
              optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"must be an object, not {kind(value)}")
        allowed = set(required) | set(optional)
        for name in required:
            if name not in value:
                # a misspelled required key is named as an unknown one is, with the key it is close to
                typo = next((k for k in value if k not in allowed and isinstance(k, str) and did_you_mean(k, [name])),
                            None)
                if typo is not None:
                    self.fail(_join(path, typo), "is not a known field" + did_you_mean(typo, allowed))
                self.fail(_join(path, name), "is required")
        for name in value:
            if name not in allowed:
                hint = did_you_mean(name, allowed)
                self.fail(_join(path, name), "is not a known field" + hint)
        return value

    def mapping(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"must be an object, not {kind(value)}")
        return value

    def string(self, value: Any, path: str, pattern: re.Pattern | None = None, what: str = "",
               max_len: int = 256) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, not {kind(value)}")
        if len(value) > max_len:
            self.fail(path, f"must be at most {max_len} characters")
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(path, f"must be {what or 'of the form ' + pattern.pattern}, not {value!r}")
        return value

    def integer(self, value: Any, path: str, minimum: int | None = None, maximum: int | None = None,
                nullable: bool = False) -> int | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, not {kind(value)}")
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, not {value}")
        if maximum is not None and value > maximum:
            self.fail(path, f"must be <= {maximum}, not {value}")
        return value

    def number(self, value: Any, path: str, nullable: bool = False) -> float | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"must be a number, not {kind(value)}")
        if not -FLOAT_MAX <= value <= FLOAT_MAX:  # compared, never converted: a 400-digit int overflows float()
            self.fail(path, "must be a finite number (one a double holds)")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"must be a boolean, not {kind(value)}")
        return value

    def scalar(self, value: Any, path: str) -> Any:
        if not isinstance(value, JSON_SCALARS):
            self.fail(path, f"must be a JSON scalar (string, number, boolean or null), not {kind(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(path, "must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2 ** 63:
            self.fail(path, "must fit in 64 bits")
        return value

    def array(self, value: Any, path: str, item: Callable[[Any, str], Any], max_items: int = 100_000) -> list:
        if not isinstance(value, list):
            self.fail(path, f"must be an array, not {kind(value)}")
        if len(value) > max_items:
            self.fail(path, f"must hold at most {max_items} items")
        return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def kind(value: Any) -> str:
    """How an error names a value's JSON type: "an object", "an array", "null"..."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


_kind = kind  # the old private name, until core/artifact.py switches to `kind`


def did_you_mean(name: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""
