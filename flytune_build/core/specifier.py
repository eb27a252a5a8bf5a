"""The PEP 440 specifier-set rule (`[tool.flytune] triton`, a bundle manifest's `toolchain.triton`),
as a regex: the core checks it without importing `packaging`."""
from __future__ import annotations

import re


def _any_case(*words: str) -> str:
    return "(?:" + "|".join("".join(f"[{c}{c.upper()}]" for c in w) for w in words) + ")"


def _pattern() -> str:
    """A PEP 440 specifier set exactly as `packaging.specifiers.SpecifierSet` reads one, spelled in
    what both `re` and JSON Schema read (no flags, no possessive quantifiers): comma-separated
    clauses, empty ones ignored. tests/test_schema.py holds the two to agreeing."""
    sep = "[-_.]?"
    pre = f"(?:{sep}{_any_case('alpha', 'beta', 'preview', 'pre', 'a', 'b', 'c', 'rc')}{sep}[0-9]*)?"
    post = f"(?:-[0-9]+|{sep}{_any_case('post', 'rev', 'r')}{sep}[0-9]*)?"
    dev = f"(?:{sep}{_any_case('dev')}{sep}[0-9]*)?"
    local = r"(?:\+[a-zA-Z0-9]+(?:[-_.][a-zA-Z0-9]+)*)?"
    version = r"\s*[vV]?(?:[0-9]+!)?[0-9]+"
    clause = "|".join((
        r"===\s*[^\s;),]+",
        rf"(?:==|!=){version}(?:\.[0-9]+)*(?:\.\*|{pre}{post}{dev}{local})",
        rf"~={version}(?:\.[0-9]+)+{pre}{post}{dev}",
        rf"(?:<=|>=|<|>){version}(?:\.[0-9]+)*{pre}{post}{dev}",
    ))
    return rf"\s*(?:(?:{clause})\s*)?(?:,\s*(?:(?:{clause})\s*)?)*"


SPECIFIER = _pattern()
SPECIFIER_RE = re.compile(SPECIFIER)
