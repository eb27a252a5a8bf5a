"""`[tool.flytune]`: the parser and the JSON Schema validate-pyproject reads come from one rule set,
and give the same verdict on every table."""
from __future__ import annotations

import re
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flytune_build.core import project
from flytune_build.core.errors import ProjectError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

validate_pyproject = pytest.importorskip("validate_pyproject")
from fastjsonschema import JsonSchemaValueException
from validate_pyproject import api, errors, plugins

BASE = 'sources = ["artifacts"]\ntargets = ["sm_90"]\n'
ENTRY = 'kernel = "demo.add", setup = "demo.tuning:add", shapes = [{ N = 1 }]'
LONG_NAME = "N" * 128

# (case, the body of [tool.flytune], valid); every key and every rule, each on both sides of its edge
CORPUS = [
    ("minimal", BASE, True),
    ("everything", f'''package = "demo"
sources = ["artifacts", "more/**/*.json"]
targets = ["sm_90", {{ arch = "gfx942", name = "AMD Instinct MI300X", units = 304, accept = ["exact", "arch"] }}]
coverage = ["demo.add", "demo.rmsnorm"]
triton = ">=3.4,<4"
strict = false
tune = {{ output = "artifacts/{{arch}}", warmup = 10, rep = 50, entries = [{{ {ENTRY}, autotuner = "demo.k:add" }}] }}
''', True),
    ("unknown-key", BASE + "soruces = 1", False),
    ("missing-sources", 'targets = ["sm_90"]', False),
    ("missing-targets", 'sources = ["a"]', False),
    ("package-dotted", BASE + 'package = "demo.sub"', True),
    ("package-dash", BASE + 'package = "my-pkg"', False),
    ("package-number", BASE + "package = 1", False),
    ("package-trailing-newline", BASE + 'package = "demo\\n"', False),
    ("sources-string", 'sources = "a"\ntargets = ["sm_90"]', False),
    ("sources-empty", 'sources = []\ntargets = ["sm_90"]', False),
    ("source-glob-and-dots-in-names", 'sources = ["a/**/*.json", "a/..b", "...", "b../c"]\ntargets = ["sm_90"]', True),
    ("source-empty-string", 'sources = [""]\ntargets = ["sm_90"]', False),
    ("source-number", 'sources = [1]\ntargets = ["sm_90"]', False),
    ("source-absolute", 'sources = ["/etc"]\ntargets = ["sm_90"]', False),
    ("source-backslash-absolute", 'sources = ["\\\\share\\\\x"]\ntargets = ["sm_90"]', False),
    ("source-drive", 'sources = ["C:x"]\ntargets = ["sm_90"]', False),
    ("source-parent", 'sources = ["../x"]\ntargets = ["sm_90"]', False),
    ("source-parent-inside", 'sources = ["a/../../x"]\ntargets = ["sm_90"]', False),
    ("source-parent-backslash", 'sources = ["a\\\\..\\\\x"]\ntargets = ["sm_90"]', False),
    ("source-parent-alone", 'sources = [".."]\ntargets = ["sm_90"]', False),
    ("source-parent-then-newline", 'sources = ["a/..\\n"]\ntargets = ["sm_90"]', True),
    ("source-nul", 'sources = ["a\\u0000b"]\ntargets = ["sm_90"]', False),
    ("source-1024", f'sources = ["{"a" * 1024}"]\ntargets = ["sm_90"]', True),
    ("source-1025", f'sources = ["{"a" * 1025}"]\ntargets = ["sm_90"]', False),
    ("targets-empty", 'sources = ["a"]\ntargets = []', False),
    ("targets-string", 'sources = ["a"]\ntargets = "sm_90"', False),
    ("target-every-arch", 'sources = ["a"]\ntargets = ["sm_90", "sm_100a", "gfx942", "gfx90a", "interpreter"]', True),
    ("target-bad-arch", 'sources = ["a"]\ntargets = ["sm90"]', False),
    ("target-arch-int", 'sources = ["a"]\ntargets = [{ arch = 90 }]', False),
    ("target-no-arch", 'sources = ["a"]\ntargets = [{ units = 132 }]', False),
    ("target-unknown-key", 'sources = ["a"]\ntargets = [{ arch = "sm_90", arhc = 1 }]', False),
    ("target-full", (f'sources = ["a"]\ntargets = [{{ arch = "sm_90", name = "{LONG_NAME}", units = 0, '
                     'accept = ["arch", "arch", "exact"] }]'), True),
    ("target-name-empty", 'sources = ["a"]\ntargets = [{ arch = "sm_90", name = "" }]', False),
    ("target-name-129", f'sources = ["a"]\ntargets = [{{ arch = "sm_90", name = "{LONG_NAME}N" }}]', False),
    ("target-name-not-ascii", 'sources = ["a"]\ntargets = [{ arch = "sm_90", name = "H200é" }]', False),
    ("target-units-max", 'sources = ["a"]\ntargets = [{ arch = "sm_90", units = 100000 }]', True),
    ("target-units-negative", 'sources = ["a"]\ntargets = [{ arch = "sm_90", units = -2 }]', False),
    ("target-units-over", 'sources = ["a"]\ntargets = [{ arch = "sm_90", units = 100001 }]', False),
    ("target-units-string", 'sources = ["a"]\ntargets = [{ arch = "sm_90", units = "132" }]', False),
    ("target-accept-empty", 'sources = ["a"]\ntargets = [{ arch = "sm_90", accept = [] }]', False),
    ("target-accept-unknown", 'sources = ["a"]\ntargets = [{ arch = "sm_90", accept = ["close"] }]', False),
    ("target-repeated", 'sources = ["a"]\ntargets = ["sm_90", "gfx942", "sm_90"]', False),
    ("coverage-all", BASE + 'coverage = "all"', True),
    ("coverage-none", BASE + 'coverage = "none"', True),
    ("coverage-empty-list", BASE + "coverage = []", True),
    ("coverage-word", BASE + 'coverage = "most"', False),
    ("coverage-number", BASE + "coverage = 1", False),
    ("coverage-bad-name", BASE + 'coverage = ["a b"]', False),
    ("coverage-name-200", BASE + f'coverage = ["{"k" * 200}"]', True),
    ("coverage-name-201", BASE + f'coverage = ["{"k" * 201}"]', False),
    ("triton-range", BASE + 'triton = ">=3.4,<4"', True),
    ("triton-wildcard", BASE + 'triton = "==3.6.*"', True),
    ("triton-compatible", BASE + 'triton = "~=3.4"', True),
    ("triton-spaces-and-empty-clauses", BASE + 'triton = " >= 3.4 , , <4.0rc1 ,"', True),
    ("triton-local", BASE + 'triton = "!=3.5.0+cu130.1"', True),
    ("triton-arbitrary", BASE + 'triton = "===3.6-custom"', True),
    ("triton-empty", BASE + 'triton = ""', True),
    ("triton-word", BASE + 'triton = "three"', False),
    ("triton-parenthesised", BASE + 'triton = "(>=3.4)"', False),
    ("triton-wildcard-with-ge", BASE + 'triton = ">=3.4.*"', False),
    ("triton-compatible-one-part", BASE + 'triton = "~=3"', False),
    ("triton-marker", BASE + 'triton = ">=3; python_version > \'3\'"', False),
    ("triton-number", BASE + "triton = 3", False),
    ("strict-true", BASE + "strict = true", True),
    ("strict-string", BASE + 'strict = "yes"', False),
    ("packs", BASE + 'packs = ["vendor-configs", "Vendor_Configs2", "a", "x.y"]', True),
    ("packs-empty", BASE + "packs = []", True),
    ("packs-string", BASE + 'packs = "vendor-configs"', False),
    ("packs-not-a-name", BASE + 'packs = ["vendor configs"]', False),
    ("packs-trailing-dash", BASE + 'packs = ["vendor-"]', False),
    ("packs-trailing-newline", BASE + 'packs = ["vendor\\n"]', False),
    ("tune-plan", BASE + 'tune = { plan = "plan.toml" }', True),
    ("tune-entries-empty", BASE + "tune = { entries = [] }", True),
    ("tune-both", BASE + 'tune = { plan = "p.toml", entries = [] }', False),
    ("tune-neither", BASE + "tune = { warmup = 5 }", False),
    ("tune-not-a-table", BASE + 'tune = "plan.toml"', False),
    ("tune-unknown", BASE + 'tune = { plna = "x" }', False),
    ("tune-edges", BASE + "tune = { entries = [], warmup = 1, rep = 100000 }", True),
    ("tune-warmup-zero", BASE + "tune = { entries = [], warmup = 0 }", False),
    ("tune-warmup-20000", BASE + "tune = { entries = [], warmup = 20000 }", False),
    ("tune-warmup-string", BASE + 'tune = { entries = [], warmup = "25" }', False),
    ("tune-warmup-bool", BASE + "tune = { entries = [], warmup = true }", False),
    ("tune-rep-over", BASE + "tune = { entries = [], rep = 100001 }", False),
    ("tune-plan-absolute", BASE + 'tune = { plan = "/plan.toml" }', False),
    ("tune-plan-empty", BASE + 'tune = { plan = "" }', False),
    ("tune-output-parent", BASE + 'tune = { entries = [], output = "../x/{arch}" }', False),
    ("entry-check-tolerances", BASE + f'tune = {{ entries = [{{ {ENTRY}, rtol = 0, atol = 1e6, check = false }}] }}',
     True),
    ("entry-rtol-int", BASE + f'tune = {{ entries = [{{ {ENTRY}, rtol = 1 }}] }}', True),
    ("entry-rtol-negative", BASE + f'tune = {{ entries = [{{ {ENTRY}, rtol = -1e-3 }}] }}', False),
    ("entry-atol-over", BASE + f'tune = {{ entries = [{{ {ENTRY}, atol = 1.5e6 }}] }}', False),
    ("entry-atol-string", BASE + f'tune = {{ entries = [{{ {ENTRY}, atol = "1e-3" }}] }}', False),
    ("entry-rtol-bool", BASE + f'tune = {{ entries = [{{ {ENTRY}, rtol = true }}] }}', False),
    ("entry-check-string", BASE + f'tune = {{ entries = [{{ {ENTRY}, check = "no" }}] }}', False),
    ("entry-reference", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = "demo.ref_1:add_ref" }}] }}', True),
    ("entry-reference-no-colon", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = "demo.ref" }}] }}', False),
    ("entry-reference-dotted-attr", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = "demo:ref.add" }}] }}',
     False),
    ("entry-reference-unicode", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = "démo:add" }}] }}', False),
    ("entry-reference-trailing-newline", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = "demo:add\\n" }}] }}',
     False),
    ("entry-reference-number", BASE + f'tune = {{ entries = [{{ {ENTRY}, reference = 1 }}] }}', False),
    ("entry-autotuner", BASE + f'tune = {{ entries = [{{ {ENTRY}, autotuner = "demo.kernels:add" }}] }}', True),
    ("entry-shapes-scalars", BASE + 'tune = { entries = [{ kernel = "k", setup = "m.n:f", '
                                    'shapes = [{ N = 1, x = "float16", f = 0.5, big = 1e300, even = true }, {}] }] }',
     True),
    ("entry-unicode-module", BASE + 'tune = { entries = [{ kernel = "k", setup = "démo:f", shapes = [{ N = 1 }] }] }',
     True),
    ("entry-no-shapes", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f" }] }', False),
    ("entry-shapes-empty", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [] }] }', False),
    ("entry-shape-not-table", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [1] }] }', False),
    ("entry-shape-array", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [{ N = [1] }] }] }',
     False),
    ("entry-shape-nan", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [{ N = nan }] }] }', False),
    ("entry-shape-inf", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [{ N = -inf }] }] }',
     False),
    ("entry-shape-date", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", shapes = [{ N = 2026-01-01 }] }] }',
     False),
    ("entry-setup-no-colon", BASE + 'tune = { entries = [{ kernel = "k", setup = "nope", shapes = [{ N = 1 }] }] }',
     False),
    ("entry-autotuner-bad", BASE + f'tune = {{ entries = [{{ {ENTRY}, autotuner = "x" }}] }}', False),
    ("entry-kernel-bad", BASE + 'tune = { entries = [{ kernel = "a b", setup = "m:f", shapes = [{ N = 1 }] }] }',
     False),
    ("entry-unknown-key", BASE + f'tune = {{ entries = [{{ {ENTRY}, shape = [] }}] }}', False),
    ("not-a-table", None, False),
]

# What JSON Schema (draft 07, as validate-pyproject runs it) cannot say: the parser refuses these, the
# schema lets them through. Each is pinned, so a change on either side shows.
INEXPRESSIBLE = [
    # "no two targets with the same arch/units/name": uniqueItems compares whole entries
    ("target-same-label", 'sources = ["a"]\ntargets = ["sm_90", { arch = "sm_90", accept = ["arch"] }]'),
    # an integral float is an "integer" to JSON Schema since draft 06
    ("warmup-float", BASE + "tune = { entries = [], warmup = 25.0 }"),
    ("units-float", 'sources = ["a"]\ntargets = [{ arch = "sm_90", units = 132.0 }]'),
    # a number is a number: nothing tells the integer 2**64 from the float 2.0**64
    ("shape-int-over-64-bits", BASE + 'tune = { entries = [{ kernel = "k", setup = "m:f", '
                                      'shapes = [{ N = 99999999999999999999 }] }] }'),
]


@pytest.fixture(scope="module")
def validator():
    """validate-pyproject with our schema, found through the registered entry point."""
    found = plugins.list_from_entry_points(lambda ep: ep.name == "flytune")
    assert [p.tool for p in found] == ["flytune"]
    return api.Validator(plugins=found)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root holding one package, so `package` can be inferred."""
    root = tmp_path_factory.mktemp("proj")
    (root / "demo").mkdir()
    (root / "demo" / "__init__.py").write_text("")
    return root


def parser_accepts(table, root) -> bool:
    try:
        project.parse(table, root=root, file=root / "pyproject.toml")
        return True
    except ProjectError:
        return False


def schema_accepts(table, validator) -> bool:
    try:
        validator({"tool": {"flytune": table}})
        return True
    except errors.ValidationError:
        return False
    except TypeError as e:  # refused, then validate-pyproject's report fails to print a TOML date as JSON
        assert isinstance(e.__context__, JsonSchemaValueException), e
        return False


def table_of(body):
    return 1 if body is None else tomllib.loads(body)


def test_corpus_is_large_and_covers_every_key():
    assert len(CORPUS) >= 40
    assert sum(ok for *_, ok in CORPUS) >= 15 and sum(not ok for *_, ok in CORPUS) >= 25
    text = "".join(body or "" for _, body, _ in CORPUS)
    keys = {*project.TOOL_FLYTUNE.keys, *project.TUNE.keys, *project.ENTRY.keys, "arch", "name", "units", "accept"}
    assert all(re.search(rf"\b{k} =", text) for k in keys), keys


@pytest.mark.parametrize("case,body,valid", CORPUS, ids=[c[0] for c in CORPUS])
def test_parser_and_schema_give_the_same_verdict(case, body, valid, validator, root):
    table = table_of(body)
    assert parser_accepts(table, root) is valid, "parser"
    assert schema_accepts(table, validator) is valid, "schema"


@pytest.mark.parametrize("case,body", INEXPRESSIBLE, ids=[c[0] for c in INEXPRESSIBLE])
def test_what_json_schema_cannot_say_is_left_to_the_parser(case, body, validator, root):
    table = table_of(body)
    assert not parser_accepts(table, root)
    assert schema_accepts(table, validator)


def test_the_registered_schema_is_the_generated_one():
    from flytune_build.core.schema import tool_schema

    schema = tool_schema()
    assert schema["$id"] and schema["$schema"].startswith("http://json-schema.org/draft-07/")
    assert schema["properties"].keys() == project.TOOL_FLYTUNE.keys.keys()
    assert schema["required"] == ["sources", "targets"]
    assert schema["properties"]["tune"]["properties"]["warmup"]["default"] == project.WARMUP


# -- the PEP 440 specifier: one regular expression, agreeing with packaging --------------------------------
SPECIFIERS = [
    "", " ", ",", ">=3", ">=3.4,<4", "==3.6.*", "==3.6.*.1", "!=3.*", "~=3", "~=3.4", "~=3.4.*", "<=1!2.0",
    ">1.0a1", ">1.0.alpha.1", "<1.0-1", "<1.0post", "<1.0.rev2", "<1.0_r", ">=1.0.dev", ">=1.0-DEV3", ">=V1",
    "==1.0+local.2-x", ">=1.0+local", "~=1.0+local", "===anything", "=== spaced", "===a,b", "===", "==",
    "(>=3)", "three", ">=3;", ">= 3.4", "> =3", ">=3 .4", "=>3", ">=3.4 , <4 ,", ",,>=3", ">=1.0RC1",
    ">=1.0c", ">=1.0preview2", ">=1.0pre", "==1.0.post1.dev2+abc", ">=1.0a.post.dev", "==01.02", ">=1..0",
    ">=1.", "<v", ">=1.0\n", "\t>=1.0", ">=1\u00a0", "<1.0\u212a", ">=1.0ſ", "==1.0+ſ", "≥3",
]


def _packaging_accepts(text: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(text)
        return True
    except InvalidSpecifier:
        return False


@pytest.mark.parametrize("text", SPECIFIERS)
def test_specifier_pattern_agrees_with_packaging(text, validator):
    ok = _packaging_accepts(text)
    assert bool(re.fullmatch(project.SPECIFIER, text)) is ok
    assert schema_accepts({"sources": ["a"], "targets": ["sm_90"], "triton": text}, validator) is ok


_SPEC_ALPHABET = st.sampled_from(list("<>=!~*.,+-_!0123456789 vVaAbBcCrRdDeEpPoOsStTlLwWhHiIxX;()\t\n") +
                                 ["==", ">=", "~=", "===", "dev", "post", "rc", "alpha", ".*", "\u212a", "ſ"])


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_SPEC_ALPHABET, max_size=14).map("".join))
def test_specifier_pattern_agrees_with_packaging_fuzzed(text):
    assert bool(re.fullmatch(project.SPECIFIER, text)) is _packaging_accepts(text), text


# -- near misses of a full table: both sides agree wherever JSON Schema can say the rule ------------------
FULL = tomllib.loads(CORPUS[1][1])
_STRINGS = st.sampled_from(["", "sm_90", "gfx942", "interpreter", "sm90", "all", "none", "most", "demo", "a b",
                            "my-pkg", "m:f", "m.n:f", "nope", "/abs", "../x", "a/..", "C:x", ">=3.4", "three",
                            "==3.*", "exact", "arch", "close", "x" * 300]) | st.text(max_size=6)
_SCALARS = (_STRINGS | st.booleans() | st.integers(-2, 200_000)
            | st.floats(allow_subnormal=False).filter(lambda x: not x.is_integer()))
_VALUES = st.recursive(_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(_STRINGS, c, max_size=3),
                       max_leaves=6)


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _with(doc, path, value):
    import copy

    doc = copy.deepcopy(doc)
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return doc


def _same_label_twice(table) -> bool:
    targets = table.get("targets")
    if not isinstance(targets, list):
        return False
    labels = [t if isinstance(t, str) else (t.get("arch"), t.get("units"), t.get("name"))
              for t in targets if isinstance(t, (str, dict))]
    labels = [(label, None, None) if isinstance(label, str) else label for label in labels]
    return len(set(map(repr, labels))) < len(labels) and len(set(map(repr, targets))) == len(targets)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(table=st.sampled_from(sorted(_paths(FULL), key=repr)).flatmap(
    lambda p: _VALUES.map(lambda v: _with(FULL, p, v))))
def test_parser_and_schema_agree_on_near_misses(table, validator, root):
    assume(not _same_label_twice(table))
    assert parser_accepts(table, root) is schema_accepts(table, validator), table
