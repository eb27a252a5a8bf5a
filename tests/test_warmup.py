"""`flytune warmup`: the specialization a search records, and the warm-up that compiles from it.

Kernels run on the interpreter here, which compiles nothing; one test compiles for real (sm_90 on
the CPU, no GPU) and checks the cache key against the one Triton's own launch path computes.
"""
import io
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from buildkit import H200, KERNEL, ROOT, pyproject
from conftest import python_env

import flytune_build as ft
from flytune_build import pipeline
from flytune_build.cli import render
from flytune_build.core import settings
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.config import Config
from flytune_build.core.errors import ArtifactError, FlytuneError, FlytuneWarning
from flytune_build.pipeline import directory, reader
from flytune_build.runtime.warming import binder as specialization
from flytune_build.runtime import events


@triton.jit
def scale_kernel(x, out, n, one, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n * one
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


@triton.jit
def _scale_even(x, out, n, alpha, EVEN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out + offs, tl.load(x + offs) * alpha)
    else:
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * alpha, mask=offs < n)


# heuristics under autotune (Triton's tutorials, triton.ops.matmul): the heuristic sees the config's BLOCK
scale_even = triton.autotune([triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"],
                             do_bench=lambda fn, quantiles=None: [fn() or 1.0] * 3)(
    triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})(_scale_even))


def search(kernel, *calls):
    """Run `calls` with search forced (synthetic ranking); the artifacts the searches made."""
    seen = []
    with settings.override(autotune="search", ranking="synthetic"), events.on_decision(seen.append):
        for call in calls:
            call()
    return [ev["artifact"] for ev in seen if ev["kernel"] == kernel]


def make_site(tmp, pkg="fixpkg", edit=None, devices=("interpreter", "h200")):
    """`pkg`, tuned (synthetic) under the interpreter and bundled by the build pipeline, laid out as
    an installed distribution in `tmp/site` (package, bundle, dist-info with its entry point)."""
    proj, site = tmp / "proj", tmp / "site"
    (proj / pkg).mkdir(parents=True)
    (proj / "pyproject.toml").write_text(pyproject().replace("fixpkg", pkg))
    (proj / pkg / "__init__.py").write_text(KERNEL.replace("fixpkg", pkg))
    shutil.copytree(proj / pkg, site / pkg)
    sys.path.insert(0, str(site))
    try:
        mod = __import__(pkg)
        arts = search(f"{pkg}.add", *(lambda n=n: mod.add(torch.randn(n), torch.randn(n)) for n in (100, 256)))
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(pkg, None)
    for a in arts:
        prov = dict(a.provenance)
        if edit is not None:
            prov["specialization"] = edit(json.loads(json.dumps(prov["specialization"])))
        if "interpreter" in devices:
            a.with_provenance(prov).save(proj / "artifacts")
        if "h200" in devices:
            Artifact(a.kernel, a.key, H200, a.config, prov).save(proj / "artifacts")
    directory.write(pipeline.run(proj, out=io.StringIO()), site / pkg)
    info = site / f"{pkg}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[flytune.bundles]\n{pkg} = {pkg}._flytune\n")
    return site


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Install a site made by `make_site` on sys.path for this test; its package is forgotten after."""
    def install(**kw):
        site = make_site(tmp_path / kw.get("pkg", "fixpkg"), **kw)
        monkeypatch.syspath_prepend(str(site))
        return site
    yield install
    for name in [m for m in sys.modules if m.split(".")[0] in ("fixpkg", "badpkg")]:
        sys.modules.pop(name)


# -- what a search records ----------------------------------------------------------------------------
def test_search_records_how_triton_specialised_the_winner():
    k = ft.autotune([Config({"BLOCK": b}) for b in (16, 32)], ["n"], name="t.scale")(scale_kernel)
    x, out = torch.randn(100), torch.empty(100)
    (art,) = search("t.scale", lambda: k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, out, 100, 1, 0.5))
    spec = art.provenance["specialization"]
    assert spec["kernel"] == f"{__name__}:scale_kernel"
    assert spec["signature"] == {"x": "*fp32", "out": "*fp32", "n": "i32", "one": "constexpr", "alpha": "fp32",
                                 "BLOCK": "constexpr"}
    assert spec["constexprs"] == {"one": 1, "BLOCK": art.config.kwargs["BLOCK"]}  # ==1 is specialised
    assert spec["attrs"]["x"] == [["tt.divisibility", 16]] and spec["attrs"]["n"] == []  # 100 % 16 != 0
    assert spec["options"] == {}
    data = art.to_bytes()  # written, read strictly and by the build's fast reader, unchanged
    assert Artifact.from_bytes(data, file=art.filename, canonical=True).provenance["specialization"] == spec
    assert reader.read_tuned(data) is not None
    assert reader.read(data, file=art.filename).provenance["specialization"] == spec


def test_specialization_rebuilds_exactly_what_tritons_launch_path_compiles():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    config = Config({"BLOCK": 32}, num_warps=2)
    x, out = torch.randn(64), torch.empty(64)
    spec = specialization.capture(scale_kernel, (x, out, 64, 1, 0.25), {}, config)
    jit, backend = specialization.compilable(scale_kernel), make_backend(GPUTarget("cuda", 90, 32))
    kwargs = {**config.launch_kwargs(), "debug": False, "instrumentation_mode": ""}
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, spec_t, opts = binder(x, out, 64, 1, 0.25, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, spec_t, opts)  # JITFunction.run's
    rebuilt = specialization.compile_inputs(spec, jit, config)
    assert rebuilt[:2] == (signature, constexprs) and str(rebuilt[2]) == str(attrs)  # attrs enter the key as str()
    src, parsed, digest = specialization.cache_hash(spec, jit, config, backend)
    assert src.hash() == ASTSource(jit, signature, constexprs, attrs).hash() and parsed.hash() == options.hash()


def test_a_kernel_not_reachable_by_name_records_none_with_one_warning():
    @triton.jit
    def local_kernel(x, out, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)

    k = ft.autotune([Config({"BLOCK": 16})], ["n"], name="t.local")(local_kernel)
    with pytest.warns(FlytuneWarning, match="specialization is not recorded .*cannot be imported by name"):
        (art,) = search("t.local", lambda: k[(1,)](torch.randn(8), torch.empty(8), 8))
    assert "specialization" not in art.provenance


@pytest.mark.parametrize("change, field", [
    ({"kernel": "os.system"}, "provenance.specialization.kernel"),
    ({"format": 2}, "provenance.specialization.format"),
    ({"signature": {"x": 3}}, "provenance.specialization.signature.x"),
    ({"constexprs": {"nope": 1}}, "provenance.specialization.constexprs.nope"),
    ({"attrs": {"x": [["tt.divisibility"]]}}, "provenance.specialization.attrs.x[0]"),
    ({"options": {"debug": [1]}}, "provenance.specialization.options.debug"),
    ({"extra": 1}, "provenance.specialization.extra"),
])
def test_a_malformed_specialization_is_rejected_naming_the_field(change, field):
    spec = {"format": 1, "kernel": "pkg.k:kernel", "signature": {"x": "*fp16"}, "constexprs": {}, "attrs": {},
            "options": {}}
    doc = Artifact("pkg.k", {"n": 1}, H200, Config({"BLOCK": 16}), {"specialization": {**spec, **change}}).to_json()
    with pytest.raises(ArtifactError) as e:
        Artifact.from_json(doc, file="a.json")
    assert e.value.field == field


# -- the warm-up ------------------------------------------------------------------------------------------
def test_artifacts_made_before_specialization_still_load_and_are_skipped_with_a_note(tmp_path, monkeypatch):
    old = load_dir(ROOT / "sample_pkg" / "artifacts" / "interpreter", canonical=True)
    assert old and all("specialization" not in a.provenance for a in old)
    site = tmp_path / "site"
    # laid out as installed: the package itself, then its bundle (the owner is the package imported from site)
    shutil.copytree(ROOT / "sample_pkg" / "sample_pkg", site / "sample_pkg",
                    ignore=shutil.ignore_patterns("_flytune", "__pycache__"))
    directory.write(pipeline.run(ROOT / "sample_pkg", out=io.StringIO()), site / "sample_pkg")
    info = site / "sample_pkg-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sample-pkg\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[flytune.bundles]\nsample-pkg = sample_pkg._flytune\n")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "sample_pkg" or m.startswith("sample_pkg.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's import of the checkout's sample_pkg
    report = ft.warmup("sample-pkg")
    assert report.ok and {u.status for u in report.units} == {"skipped"}
    assert sum(len(u.keys) for u in report.units) == len(old)  # only this device's (interpreter) artifacts
    assert all("record no specialization" in u.note for u in report.units)
    assert "sample_pkg.kernels" not in sys.modules  # nothing was imported for them


def test_under_the_interpreter_each_config_is_reported_with_nothing_to_compile(installed):
    installed()
    report = ft.warmup("fixpkg")
    assert report.ok and len(report.units) == 2  # n=100 and n=256 specialise differently (alignment of n)
    assert all(u.status == "interpreter" and u.note == "interpreter: nothing to compile" for u in report.units)
    assert "fixpkg" in sys.modules  # resolved: the package's own kernel was imported and matched
    assert "2 on the interpreter" in render.render_warmup(report)


def test_warmup_imports_nothing_outside_the_bundles_package(installed, tmp_path):
    (tmp_path / "evil_mod.py").write_text("import triton\n@triton.jit\ndef add_kernel(x): pass\n")
    site = installed(pkg="badpkg", edit=lambda s: {**s, "kernel": "evil_mod:add_kernel"})
    shutil.copy(tmp_path / "evil_mod.py", site)
    report = ft.warmup("badpkg")
    assert {u.status for u in report.units} == {"skipped"}
    assert all("outside package badpkg: not imported" in u.note for u in report.units)
    assert "evil_mod" not in sys.modules


def test_a_kernel_whose_parameters_changed_since_tuning_is_skipped(installed):
    def renamed(s):
        s["signature"] = {("z" if k == "x" else k): v for k, v in s["signature"].items()}
        s["attrs"] = {("z" if k == "x" else k): v for k, v in s["attrs"].items()}
        return s
    installed(pkg="badpkg", edit=renamed)
    report = ft.warmup("badpkg")
    assert {u.status for u in report.units} == {"skipped"} and all("re-tune it" in u.note for u in report.units)


def test_a_distribution_without_a_bundle_is_an_error():
    with pytest.raises(FlytuneError, match="not an installed distribution with a flytune bundle"):
        ft.warmup("no-such-distribution")


def test_background_warmup_leaves_calls_made_meanwhile_correct(installed):
    installed()
    worker = ft.warmup(background=True)
    import fixpkg

    x = torch.randn(100)
    torch.testing.assert_close(fixpkg.add(x, x), x + x)  # while (or after) it runs
    report = worker.result(timeout=60)
    assert worker.daemon and report.ok and {u.status for u in report.units} == {"interpreter"}


def test_flytune_warmup_command(installed):
    site = installed()
    env = python_env(PYTHONPATH=site, TRITON_INTERPRET=1)
    run = lambda *a: subprocess.run([sys.executable, "-m", "flytune_build.cli", "warmup", *a], capture_output=True,
                                    text=True, env=env)
    r = run("fixpkg")
    assert r.returncode == 0, r.stderr
    assert "interpreter: nothing to compile" in r.stdout and "2 on the interpreter" in r.stdout
    r = run("--json")
    doc = json.loads(r.stdout)
    assert doc["format"] == 1 and doc["ok"] and doc["counts"]["interpreter"] == 2
    r = run("no-such-distribution")
    assert r.returncode == 1 and "no-such-distribution: is not an installed distribution" in r.stderr
    env["FLYTUNE_DEVICE"] = "cuda:nonsense"   # a name mistyped is said first, whatever the device
    r = run("no-such-distribution")
    assert r.returncode == 1 and "no-such-distribution: is not an installed distribution" in r.stderr, r.stderr


def test_warmup_fills_tritons_cache_under_the_key_tritons_own_launch_computes(installed, tmp_path):
    """A real compile, for sm_90 without a GPU (FLYTUNE_DEVICE names it): the kernels land in
    TRITON_CACHE_DIR exactly where `JITFunction.run` of the tuned call will look."""
    site = installed()
    cache = tmp_path / "triton-cache"
    env = python_env(PYTHONPATH=site, TRITON_INTERPRET=0, TRITON_CACHE_DIR=cache,
                     FLYTUNE_DEVICE="cuda:sm_90:132:NVIDIA H200")
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "warmup", "--json"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["counts"]["compiled"] == 2 and "no GPU driver here" in doc["notes"][0]
    check = textwrap.dedent("""
        import hashlib, json, torch, fixpkg
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource, make_backend
        from triton.runtime.cache import get_cache_key, get_cache_manager
        from triton.runtime.jit import create_function_from_signature
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from flytune_build.core.config import Config
        jit, backend = fixpkg.add_kernel.fn, make_backend(GPUTarget("cuda", 90, 32))
        out = []
        for art in fixpkg.add_kernel.offline_index().hits.values():  # as JITFunction.run does for each tuned call
            n = art.document()["key"]["n"]
            x = torch.randn(n)
            kw = {**Config.coerce(art.config).launch_kwargs(), "debug": False, "instrumentation_mode": ""}
            bound, spec, opts = create_function_from_signature(jit.signature, jit.params, backend)(x, x, x, n, **kw)
            options, sig, consts, attrs = jit._pack_args(backend, kw, bound, spec, opts)
            key = get_cache_key(ASTSource(jit, sig, consts, attrs), backend, options, get_cache_invalidating_env_vars())
            digest = hashlib.sha256(key.encode()).hexdigest()
            out.append([digest, get_cache_manager(digest).get_group("add_kernel.json") is not None])
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert len(found) == 2 and all(hit for _, hit in found)
    assert sorted(d for d, _ in found) == sorted(u["cache_key"] for u in doc["units"])


def test_forked_compiles_build_each_signatures_launcher_once_beside_the_kernels(installed, tmp_path):
    """On a GPU the first unit of each kernel signature also builds that signature's launcher (a C
    compile) in its forked child, while the other units compile. A recording launcher class stands in
    for Triton's here (no GPU), over a real sm_90 compile."""
    site = installed()
    built = tmp_path / "built"
    built.mkdir()
    script = textwrap.dedent(f"""
        import json, os
        from pathlib import Path
        from triton.backends.compiler import GPUTarget
        from flytune_build.runtime.warming import compiler, warmup
        built = Path({str(built)!r})

        class Launcher:  # what Triton's launcher class is built from; where it was built
            def __init__(self, src, metadata):
                (built / f"{{os.getpid()}}-{{len(list(built.iterdir()))}}").write_text(compiler._signature(src))

        compiler.Toolchain.for_device = classmethod(lambda cls, dev, notes: cls(GPUTarget("cuda", 90, 32), Launcher, "x"))
        report = warmup.warmup("fixpkg", processes=True)
        print(json.dumps({{"pid": os.getpid(), "units": [[u.status, u.where] for u in report.units]}}))
    """)
    env = python_env(PYTHONPATH=site, TRITON_INTERPRET=0, TRITON_CACHE_DIR=tmp_path / "cache",
                     FLYTUNE_DEVICE="cuda:sm_90:132:NVIDIA H200")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    assert len(doc["units"]) >= 2 and all(u == ["compiled", "process"] for u in doc["units"])
    (marker,) = built.iterdir()  # one signature: one launcher, built once, in a child
    assert int(marker.name.split("-")[0]) != doc["pid"] and "'n', 'i32'" in marker.read_text()


def test_a_backend_launch_keyword_is_recorded_and_rebuilt_as_a_compile_option():
    """`waves_per_eu` in a ROCm config's kwargs binds to no parameter: it is recorded among the options
    and handed back to the compile as one, never refused as a stray constexpr."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    config = Config({"BLOCK": 32, "waves_per_eu": 2}, num_warps=2)
    x, out = torch.randn(64), torch.empty(64)
    spec = specialization.capture(scale_kernel, (x, out, 64, 1, 0.25), {}, config)
    assert spec["options"] == {"waves_per_eu": 2} and "waves_per_eu" not in spec["constexprs"]
    jit = specialization.compilable(scale_kernel)
    signature, constexprs, attrs, options = specialization.compile_inputs(spec, jit, config)
    assert options["waves_per_eu"] == 2 and "waves_per_eu" not in signature
    _, parsed, _ = specialization.cache_hash(spec, jit, config, make_backend(GPUTarget("hip", "gfx942", 64)))
    assert parsed.waves_per_eu == 2


def test_recording_an_adopted_kernel_records_its_specialization_heuristics_included():
    """`flytune tune` of a `@triton.autotune` kernel (recording) records the specialization of the winner's
    launch as a ported kernel's search does, the values of the `@triton.heuristics` above it included,
    so `flytune warmup` compiles adopted kernels' artifacts too."""
    from flytune_build import triton as adapter

    x, out = torch.randn(96), torch.empty(96)
    with settings.override(ranking="synthetic"), adapter.recording(scale_even, "t.even") as captured:
        scale_even[lambda m: (triton.cdiv(96, m["BLOCK"]),)](x, out, 96, 0.5)
    (art,) = captured
    spec = art.provenance["specialization"]
    block = art.config.kwargs["BLOCK"]
    assert spec == specialization.capture(_scale_even, (x, out, 96, 0.5), {"EVEN": 96 % block == 0}, art.config)
    assert spec["constexprs"]["EVEN"] is True and specialization.resolve(spec["kernel"], sys.modules[__name__])


def test_a_ported_kernel_over_heuristics_records_its_specialization():
    """`ft.autotune` over `@triton.heuristics` (attorch's stacking): the search records the launch of the
    @triton.jit function below, with the heuristic's value for the winner."""
    k = ft.autotune([Config({"BLOCK": b}) for b in (16, 32)], ["n"], name="t.evenport")(
        triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})(_scale_even))
    x, out = torch.randn(96), torch.empty(96)
    (art,) = search("t.evenport", lambda: k[lambda m: (triton.cdiv(96, m["BLOCK"]),)](x, out, 96, 0.5))
    block = art.config.kwargs["BLOCK"]
    spec = specialization.capture(_scale_even, (x, out, 96, 0.5), {"EVEN": 96 % block == 0}, art.config)
    assert art.provenance["specialization"] == spec


def test_warmup_imports_nothing_a_tampered_bundle_names(installed):
    """The package a warm-up imports from is its entry point's, never the manifest's `package` (data);
    a specialization that is not one is a typed note, and the bundle is not warmed."""
    site = installed(pkg="badpkg", edit=lambda s: {**s, "kernel": "antigravity:s"})
    manifest = site / "badpkg" / "_flytune" / "manifest.json"
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "package": "antigravity"}))
    report = ft.warmup("badpkg")
    assert "antigravity" not in sys.modules and not report.units
    assert any("is not antigravity._flytune, the package its manifest names" in n for n in report.notes)


def test_warmup_of_a_malformed_specialization_is_a_typed_note(installed):
    """A bundle altered after its build, hashes re-pinned: the specialization is checked before use."""
    import hashlib

    site = installed(pkg="badpkg")
    bundle_dir = site / "badpkg" / "_flytune"
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    info = manifest["kernels"]["badpkg.add"]
    prov = json.loads((bundle_dir / info["provenance"]).read_text())
    for v in prov["provenance"].values():
        v["specialization"] = "x"
    data = json.dumps(prov).encode()
    (bundle_dir / info["provenance"]).write_bytes(data)
    info["provenance_sha256"] = hashlib.sha256(data).hexdigest()
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))
    report = ft.warmup("badpkg")
    assert not report.units and any("specialization` must be an object" in n for n in report.notes), report.notes
