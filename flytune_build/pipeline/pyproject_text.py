"""pyproject.toml edited as `flytune init` edits it, as text: a table taken out with tomlkit (style-preserving:
what it does not change it writes back as read, comments and line endings included), tables appended in
the file's own line endings, and each result read back before anything is written.

Invariant: nothing outside the tables named changes; where that cannot be shown by reading the result
back (`reads_as`), the edit is refused, naming the table in the way and the fix (`closed`).
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path

from ..core import project as project_mod
from ..core.errors import ProjectError

TOML_KINDS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
TOML_ESCAPES = {**{c: f"\\u{c:04x}" for c in (*range(0x20), 0x7F)}, ord('"'): '\\"', ord("\\"): "\\\\"}


def without(text: str, table: tuple[str, ...]) -> str | None:
    """`text` less `table` however it is written (headers, dotted keys, an inline table; never a
    header-like line inside a string), a parent left empty removed too; None where tomlkit cannot."""
    import tomlkit

    try:
        doc = tomlkit.parse(text)
        parents = [doc]
        for part in table[:-1]:
            parents.append(parents[-1][part])
        del parents[-1][table[-1]]
        for parent, part in zip(reversed(parents[:-1]), reversed(table[:-1])):
            if not parent[part]:
                del parent[part]
        return with_their_comments(text, tomlkit.dumps(doc))
    except Exception:  # noqa: BLE001 - tomlkit's own errors, of many kinds: the caller refuses, writing nothing
        return None


def with_their_comments(text: str, edited: str) -> str:
    """`edited` (tomlkit's `text` less a table) with the comment and blank lines that ended each run of
    lines it took out put back: tomlkit counts the comments after a table as that table's, where they
    are the next table's (`# Black settings` above [tool.black]) or the file's last lines."""
    before, after = text.splitlines(keepends=True), edited.splitlines(keepends=True)
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        if tag == "delete":
            run, k = before[i1:i2], i2 - i1
            while k and (not run[k - 1].strip() or run[k - 1].lstrip().startswith("#")):
                k -= 1
            out += run[k:]
        else:  # kept as it was, or rewritten by tomlkit (a line holding an inline table it edited)
            out += after[j1:j2]
    return "".join(out)


def reads_as(text: str, expected: dict) -> bool:
    """Whether `text` parses to `expected` (a float nan equal to itself: TOML's `nan` is a value)."""
    try:
        got = project_mod.tomllib.loads(text)
    except project_mod.tomllib.TOMLDecodeError:
        return False
    return _same(got, expected)


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def append(text: str, block: str) -> str:
    newline = "\r\n" if "\r\n" in text else "\n"  # the file's own line endings
    if text and not text.endswith("\n"):
        text += newline
    return text + block.replace("\n", newline)


def appended(pyproject: Path, base: str, before: dict, blocks: list[tuple[str, str]]) -> str:
    """`base` with each (table, block) appended, parsed back before anything is written: it must read
    as `before` plus exactly the appended tables (TOML closes an inline table to them, and a table
    defined twice does not parse); else `closed`'s ProjectError."""
    text, expected = base, before
    for table, block in blocks:
        text = append(text, block)
        expected = _merged(expected, project_mod.tomllib.loads(block))
        if not reads_as(text, expected):
            raise closed(pyproject, table, before)
    return text


def _merged(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def closed(pyproject: Path, table: str, doc: dict) -> ProjectError:
    """Why [table] cannot be appended to pyproject.toml, naming the table in the way and the fix."""
    node, where = doc, []
    for part in table.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        where.append(part)
        node = node[part]
    if not where:
        return ProjectError(f"would not read back as what it holds plus the [{table}] table `flytune init` appends; "
                            f"nothing was written: add [{table}] by hand", file=pyproject)
    field_ = ".".join(where)
    if not isinstance(node, dict) and len(where) < len(table.split(".")):
        kind = "an array of tables" if isinstance(node, list) and node and isinstance(node[0], dict) else \
            TOML_KINDS.get(type(node), "a value")
        return ProjectError(f"is {kind}, not a table, so it cannot hold the [{table}] table `flytune init` appends; "
                            f"nothing was written: rename or remove `{field_}`, then run `flytune init` again",
                            file=pyproject, field=field_)
    return ProjectError(f"is written in a form TOML closes to the [{table}] table `flytune init` appends (an "
                        f"inline table, `{where[-1]} = {{ ... }}`, takes nothing added after it); nothing was "
                        f"written: write it as a [{field_}] header with its keys below it (each inline table "
                        f"inside it as a [{field_}.NAME] header of its own), then run `flytune init` again",
                        file=pyproject, field=field_)


def string(text: str) -> str:
    """`text` as a TOML basic string."""
    return '"' + text.translate(TOML_ESCAPES) + '"'


def key(name: str) -> str:
    """`name` as a TOML key: bare where it may be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else string(name)


def value(v) -> str:
    """A `[tool.flytune] targets` entry as TOML: a string, or an inline table of strings and integers."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + " }"
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else string(str(v))
