"""The build's fast reading of tuned artifacts.

A build reads thousands of artifacts, each mostly its candidate list (every config's timing). That
list is checked in C, against a regular grammar of the form `flytune tune` writes; every document
this path accepts is valid and canonical, and its provenance is kept as the bytes read. Anything
else, and every invalid document, takes the strict `Artifact.from_bytes(..., canonical=True)`,
which names the exact rule broken. tests/test_hardening.py checks that the two accept the same.
"""
from __future__ import annotations

import json
import os
import re

from ..core import codec
from ..core.artifact import Artifact, Provenance, read_capped
from ..core.errors import ArtifactError
from ..core.options import NAMES, OPTIONS


def _grammar() -> re.Pattern:
    """The candidate list's grammar; the config's options come from the option table."""
    key = (rb'"(?!(?:' + b"|".join(re.escape(n).encode() for n in NAMES) + rb')")'
           rb'[A-Za-z_][A-Za-z0-9_]{0,127}"')
    value = rb'(?:0|-?[1-9][0-9]{0,17}|true|false|"[\x20\x21\x23-\x5b\x5d-\x7a\x7c\x7e]{0,256}")'
    kwargs = rb'\{(?:' + key + b":" + value + rb'(?:,' + key + b":" + value + rb')*)?\}'
    opts = b"".join(b',"%s":(?:%s)' % (o.name.encode(), o.pattern().encode())
                    for o in sorted(OPTIONS, key=lambda o: o.name))  # canonical JSON sorts the keys
    config = rb'\{"kwargs":' + kwargs + opts + rb'\}'
    error = rb'"(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f])){0,4096}"'
    time = rb'(?:null|-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,24})?(?:e[-+][0-9]{1,3})?)'
    candidate = rb'\{"config":' + config + rb'(?:,"error":' + error + rb')?,"time_ms":' + time + rb'\}'
    return re.compile(rb'\[(?:' + candidate + rb'(?:,' + candidate + rb')*)?\]')


_CANDIDATE_LIST = _grammar()
_TIMES = re.compile(rb',"time_ms":([^}]*)\}')
_KWARGS = re.compile(rb'"kwargs":(\{[^}]*\})')
_PROVENANCE_MARK = b',"provenance":{"candidates":['
_SORTED_KWARGS: set[bytes] = set()  # kwargs objects seen with sorted, unique keys


def read_tuned(data: bytes) -> tuple[dict, bytes] | None:
    """(the document with its provenance lacking the candidate list, the provenance's bytes) for a
    canonical artifact whose candidate list the grammar accepts; else None. The document's other
    fields are left to `Artifact.from_json` to check."""
    i = data.find(_PROVENANCE_MARK)
    if i < 0 or len(data) > codec.MAX_DOCUMENT_BYTES:
        return None
    start = i + len(_PROVENANCE_MARK) - 1
    m = _CANDIDATE_LIST.match(data, start)
    if m is None:
        return None
    end = m.end()
    try:
        data.decode("utf-8")  # the candidate list is never decoded, but must be UTF-8 all the same
        head_bytes = data[:i] + b"}"
        head = json.loads(head_bytes)
        if type(head) is not dict or max(head, default="") >= "provenance" or codec.canonical(head) != head_bytes:
            return None
        tail = data[end:]
        if tail == b"}}\n":
            rest = {}
        elif tail[:1] == b"," and tail[-3:] == b"}}\n":  # more provenance fields, each sorting after "candidates"
            rest_bytes = b"{" + tail[1:-2]
            rest = json.loads(rest_bytes)
            if type(rest) is not dict or min(rest) <= "candidates" or codec.canonical(rest) != rest_bytes:
                return None
        else:
            return None
        if not _canonical_candidates(data[start:end]):
            return None
    except (ValueError, RecursionError):
        return None
    head["provenance"] = rest
    return head, data[i + 14:-2]  # the provenance object: after ',"provenance":', before the final '}\n'


def _canonical_candidates(candidates: bytes) -> bool:
    """What the grammar cannot say: each time as the canonical encoder writes it, kwargs sorted."""
    times = _TIMES.findall(candidates)
    if len(times) > 4096:
        return False
    joined = b"[" + b",".join(times) + b"]"
    if codec.canonical(json.loads(joined)) != joined:
        return False
    for kwargs in set(_KWARGS.findall(candidates)) - _SORTED_KWARGS:
        names = [name for name, _ in json.loads(kwargs, object_pairs_hook=list)]
        if names != sorted(set(names)):
            return False
        if len(_SORTED_KWARGS) > 65536:
            _SORTED_KWARGS.clear()
        _SORTED_KWARGS.add(kwargs)
    return True


def read(data: bytes, *, file: object = None, check_name: bool = True) -> Artifact:
    """The artifact `data` holds, which must be canonical: what the strict reading accepts, faster."""
    tuned = read_tuned(data)
    if tuned is None:
        return Artifact.from_bytes(data, file=file, check_name=check_name, canonical=True)
    doc, raw = tuned
    art = Artifact.from_json(doc, file=file)
    if check_name and file is not None:
        art.check_file_name(file)
    return art.with_provenance(Provenance(raw, art.provenance))


def load(path: str | os.PathLike) -> Artifact:
    """The canonical artifact at `path`, read as `read` does."""
    return read(read_capped(path, ArtifactError), file=path)
