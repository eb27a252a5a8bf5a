"""The in-process warm-up: tuned keys decided ahead (`Autotuned.prime`), the alignment variants a
key's buckets need, the stand-ins whose specialization is the recorded one, and FLYTUNE_WARMUP.

Kernels run on the interpreter here: the JIT's own cache (GPU only) is exercised by
benchmarks/warmup_inprocess.py on the H200; what decides it (the stand-ins, the binder's check) runs here.
"""
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from conftest import python_env
from test_warmup import installed  # noqa: F401 - the fixture

import flytune_build as ft
from flytune_build import Config, pow2
from flytune_build.core import settings
from flytune_build.core.errors import SettingsError
from flytune_build.runtime.serving import autotuner


from flytune_build.runtime.warming import binder, warmup
@triton.jit
def scale2_kernel(x, out, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


def fresh_scratch(monkeypatch, tmp_path):
    """A machine that never searched these kernels (tuning the fixture filled the scratch cache); the
    bundles rediscovered (the fixture's bundle was installed after the tuning looked for some)."""
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "fresh-scratch"))
    autotuner.reset_stats()


def test_after_a_warmup_each_tuned_key_is_decided_before_its_first_call(installed, monkeypatch, tmp_path):  # noqa: F811
    installed()
    fresh_scratch(monkeypatch, tmp_path)
    report = warmup.warmup("fixpkg")
    import fixpkg

    assert report.ok and sum(u.primed for u in report.units) == 2  # n=100 and n=256
    for n in (100, 256):
        x = torch.randn(n)
        d = fixpkg.add_kernel.decision(x, x, x, n)
        assert d is not None and d.tier == "offline" and d.calls == 0
        torch.testing.assert_close(fixpkg.add(x, x), x + x)
        assert d.calls == 1  # the first call was a hit on the decision made ahead
    assert ft.stats()["fixpkg.add"]["calls"]["offline"] == 2


def test_a_key_no_stored_tier_serves_is_left_to_its_first_call_and_no_heuristic_sees_stand_ins():
    seen = []
    k = ft.autotune([Config({"BLOCK": 16})], ["x", "n"], default=lambda a: seen.append(a) or Config({"BLOCK": 16}),
                    name="t.prime_miss")(scale2_kernel)
    assert k.prime(x=binder.Pointer(torch.float32, True), out=binder.Pointer(torch.float32, True), n=64,
                   alpha=1.5) is None
    assert seen == [] and k.decision(torch.empty(64), torch.empty(64), 64, 1.5) is None
    x = torch.randn(64)
    out = torch.empty(64)
    k[(4,)](x, out, 64, 2.0)  # the first call decides, by the heuristic, with the real arguments
    torch.testing.assert_close(out, x * 2.0)
    assert len(seen) == 1 and seen[0]["x"] is x


def _pruned(name, early, tmp_path, monkeypatch):
    """scale2 keyed on (x, n), pruned by `early`, with an artifact serving n=64 on this device."""
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.device import INTERPRETER

    fresh_scratch(monkeypatch, tmp_path)
    d = tmp_path / "artifacts"
    Artifact(name, {"x": "float32", "n": 64}, INTERPRETER, Config({"BLOCK": 32})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    return ft.autotune([Config({"BLOCK": 16}), Config({"BLOCK": 32})], ["x", "n"], name=name,
                       prune_configs_by={"early_config_prune": early})(scale2_kernel)


def _stand_ins(n=64):
    return dict(x=binder.Pointer(torch.float32, True), out=binder.Pointer(torch.float32, True), n=n, alpha=1.5)


def test_a_pruner_that_reads_only_the_keys_scalars_is_decided_ahead(tmp_path, monkeypatch):
    seen = []
    k = _pruned("t.prune_key", lambda configs, nargs, **kw: seen.append(nargs["n"]) or
                [c for c in configs if c.kwargs["BLOCK"] <= nargs["n"]], tmp_path, monkeypatch)
    d = k.prime(**_stand_ins())
    assert d is not None and d.tier == "offline" and d.config.kwargs == {"BLOCK": 32} and seen[0] == 64
    x, out = torch.randn(64), torch.empty(64)
    k[(2,)](x, out, 64, 2.0)   # a hit on the decision made ahead: the pruner is not called again
    torch.testing.assert_close(out, x * 2.0)
    assert d.calls == 1 and ft.stats()["t.prune_key"]["calls"]["offline"] == 1


def test_a_pruner_that_reads_a_key_tensors_dtype_and_element_size_is_decided_ahead(tmp_path, monkeypatch):
    """As Triton's own matmul pruner reads its operand (`named_args["A"].element_size()`, `.dtype`): the
    key holds that tensor's dtype, so a stand-in carrying it prunes as the call."""
    seen = []
    k = _pruned("t.prune_dtype", lambda configs, nargs, **kw: seen.append((nargs["x"].dtype, nargs["x"].element_size()))
                or [c for c in configs if c.kwargs["BLOCK"] * nargs["x"].element_size() <= 4 * nargs["n"]],
                tmp_path, monkeypatch)
    d = k.prime(**_stand_ins())
    assert d is not None and d.config.kwargs == {"BLOCK": 32} and seen[0] == (torch.float32, 4)
    x, out = torch.randn(64), torch.empty(64)
    k[(2,)](x, out, 64, 2.0)
    torch.testing.assert_close(out, x * 2.0)
    assert d.calls == 1


@pytest.mark.parametrize("early", [
    lambda configs, nargs, **kw: configs if nargs["alpha"] > 0 else configs[:1],       # a non-key argument
    lambda configs, nargs, **kw: configs if nargs["x"].data_ptr() % 16 == 0 else configs,  # a key tensor's address
    lambda configs, nargs, **kw: configs if nargs["out"].dtype else configs,             # a tensor not in the key
    lambda configs, nargs, **kw: configs if nargs["x"].numel() > 0 else configs[:1],   # a tensor (a stand-in)
    lambda configs, nargs, **kw: configs if nargs.get("out") is not None else configs,  # by get
    lambda configs, nargs, **kw: configs if len(dict(nargs)) else configs,              # a copy of them all
    lambda configs, nargs, **kw: [c for c in configs if all(v is not None for v in nargs.values())],
    lambda configs, nargs, **kw: configs if str(nargs) else configs,                    # printed
    lambda configs, nargs, **kw: configs if (nargs | {})["n"] else configs,             # merged
    lambda configs, nargs, **kw: filter(lambda c: nargs["alpha"] > 0, configs),          # lazily, as consumed
    lambda configs, nargs, **kw: (c for c in configs if nargs["x"].shape[0] >= 0),        # a generator
], ids=["scalar", "address", "other-dtype", "tensor", "get", "copy", "values", "repr", "merged", "filter",
        "generator"])
def test_a_pruner_that_reads_more_than_the_keys_scalars_decides_at_the_first_call(early, tmp_path, monkeypatch):
    k = _pruned("t.prune_more", early, tmp_path, monkeypatch)
    assert k.prime(**_stand_ins()) is None and k.decision(torch.empty(64), torch.empty(64), 64, 1.5) is None
    x, out = torch.randn(64), torch.empty(64)
    k[(2,)](x, out, 64, 2.0)   # decided by the call, with its own arguments
    torch.testing.assert_close(out, x * 2.0)
    assert ft.stats()["t.prune_more"]["calls"]["offline"] == 1


def test_a_perf_model_that_cannot_read_stand_ins_does_not_stop_a_key_decided_ahead(tmp_path, monkeypatch):
    model = lambda x, n, BLOCK, **kw: x.numel() / BLOCK  # noqa: E731 - a stand-in has no numel
    k = _pruned("t.prune_model", lambda configs, nargs, **kw: [c for c in configs if c.kwargs["BLOCK"] <= nargs["n"]],
                tmp_path, monkeypatch)
    k.prune_configs_by.update(perf_model=model, top_k=1)
    d = k.prime(**_stand_ins())   # the hook is the pruner's business alone: the perf_model is not asked
    assert d is not None and d.config.kwargs == {"BLOCK": 32}
    x, out = torch.randn(64), torch.empty(64)
    k[(2,)](x, out, 64, 2.0)
    torch.testing.assert_close(out, x * 2.0)
    assert d.calls == 1


def test_a_key_left_to_its_first_call_reads_no_scratch_cache_ahead(tmp_path, monkeypatch):
    """The scratch cache is read at the first decision, after the settings settle (FLYTUNE_CACHE_DIR may be
    set between a warm-up at import and the first call), never by the warm-up."""
    k = _pruned("t.prune_late", lambda configs, nargs, **kw: configs if nargs["alpha"] else configs, tmp_path,
                monkeypatch)
    assert k.prime(**_stand_ins()) is None and k._scratch._loaded == {}
    k = _pruned("t.prune_early", lambda configs, nargs, **kw: configs if nargs["n"] else configs, tmp_path,
                monkeypatch)
    assert k.prime(**_stand_ins()) is not None


def test_a_kernel_with_a_scratch_cache_is_not_decided_ahead(tmp_path, monkeypatch):
    fresh_scratch(monkeypatch, tmp_path)
    k = ft.autotune([Config({"BLOCK": 16})], ["n"], name="t.prime_scratch")(scale2_kernel)
    (tmp_path / "fresh-scratch").mkdir()
    (tmp_path / "fresh-scratch" / "t.prime_scratch.json").write_text("{}")  # winners searched here depend on tensor layouts too
    assert k.prime(n=64) is None


def spec_of(kernel, args, config):
    return binder.capture(kernel, args, {}, config)


def test_stand_ins_specialise_exactly_as_the_recorded_launch():
    config = Config({"BLOCK": 32}, num_warps=2)
    for n in (64, 100):  # aligned, and not
        spec = spec_of(scale2_kernel, (torch.randn(n), torch.empty(n), n, 0.5), config)
        jit = binder.compilable(scale2_kernel)
        _, specialization, extra = _bind(jit, spec, config)
        binder.check_specialization(spec, jit, specialization, _backend())  # raises on any difference
        assert extra["num_warps"] == 2 and "BLOCK" not in extra


def test_stand_ins_that_would_specialise_otherwise_are_refused():
    config = Config({"BLOCK": 32})
    spec = spec_of(scale2_kernel, (torch.randn(100), torch.empty(100), 100, 0.5), config)
    jit = binder.compilable(scale2_kernel)
    aligned = dict(spec, attrs={**spec["attrs"], "n": [["tt.divisibility", 16]]})  # not what n=100 gives
    _, specialization, _ = _bind(jit, spec, config)
    with pytest.raises(binder.Mismatch, match="attributes"):
        binder.check_specialization(aligned, jit, specialization, _backend())
    with pytest.raises(binder.Mismatch, match="tuple argument"):
        binder.stand_ins({**spec, "signature": {**spec["signature"], "x": ["*fp32", "*fp32"]}}, config)


@triton.jit
def copy_rows_kernel(x_desc, y_desc, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M
    y_desc.store([om, 0], x_desc.load([om, 0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float8_e4m3fn])
def test_host_tensor_descriptors_get_stand_ins_that_specialise_as_recorded(dtype):
    from triton.tools.tensor_descriptor import TensorDescriptor

    config = Config({"BLOCK_M": 64, "BLOCK_N": 32})
    x = torch.zeros(256, 32).to(dtype)
    spec = spec_of(copy_rows_kernel, (TensorDescriptor.from_tensor(x, [64, 32]),
                                      TensorDescriptor.from_tensor(torch.empty_like(x), [64, 32]), 256), config)
    assert spec["signature"]["x_desc"].startswith("tensordesc<")
    jit = binder.compilable(copy_rows_kernel)
    _, specialization, _ = _bind(jit, spec, config)
    binder.check_specialization(spec, jit, specialization, _backend())  # raises on any difference
    assert [s[0] for s in specialization[:2]] == [spec["signature"]["x_desc"]] * 2
    # and through the binder a GPU's JIT builds (NVIDIA's backend), against real descriptors over real tensors
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(jit.signature, jit.params, CUDABackend)
    options = dict(**config.launch_kwargs(), debug=False, instrumentation_mode="")
    _, ours, _ = bind(**binder.stand_ins(spec, config, exclude=set(config.kwargs)), **options)
    _, real, _ = bind(TensorDescriptor.from_tensor(x, [64, 32]), TensorDescriptor.from_tensor(x, [64, 32]), 256,
                      **options)
    assert ours == real
    binder.check_specialization(spec, jit, ours, CUDABackend)


@pytest.mark.parametrize("ty", ["tensordesc<fp16[64, 32],#shared>", "tensordesc<fp16[3, 32]>",
                                "tensordesc<cx64[64, 32]>", "tensordesc<fp16[]>", "tensordesc<fp16[064, 32]>"])
def test_descriptors_of_another_form_are_refused_by_name(ty):
    config = Config({"BLOCK_M": 64, "BLOCK_N": 32})
    x = torch.zeros(256, 32).half()
    from triton.tools.tensor_descriptor import TensorDescriptor

    spec = spec_of(copy_rows_kernel, (TensorDescriptor.from_tensor(x, [64, 32]),
                                      TensorDescriptor.from_tensor(x, [64, 32]), 256), config)
    spec["signature"]["y_desc"] = ty
    with pytest.raises(binder.Mismatch, match=r"y_desc is a tensordesc<.* descriptor"):
        binder.stand_ins(spec, config, exclude=set(config.kwargs))


def test_a_bucketed_axis_tuned_aligned_gets_its_unaligned_variant_and_an_exact_one_none():
    k = ft.autotune([Config({"BLOCK": 32})], ["x", pow2("n")], name="t.variants")(scale2_kernel)
    config = Config({"BLOCK": 32})
    spec = spec_of(scale2_kernel, (torch.randn(256), torch.empty(256), 256, 0.5), config)
    unit = warmup.Unit("t.variants", "test", "tests", config, spec, [{"x": "float32", "n": 256}], tuned=k)
    (variant,) = warmup.variants([(unit, scale2_kernel)])
    v = variant[0]
    assert v.variant == ("n",) and v.spec["attrs"]["n"] == [] and v.spec["attrs"]["x"] == spec["attrs"]["x"]
    # what a call in n's bucket that is not a multiple of 16 (n=200 -> 256) specialises as
    assert v.spec == spec_of(scale2_kernel, (torch.randn(200), torch.empty(200), 200, 0.5), config)
    assert warmup.variants([(unit, scale2_kernel), variant]) == []  # planned once
    exact = ft.autotune([Config({"BLOCK": 32})], ["x", "n"], name="t.variants_exact")(scale2_kernel)
    assert warmup.variants([(warmup.Unit("t.variants_exact", "test", "tests", config, spec, [], tuned=exact),
                             scale2_kernel)]) == []


def test_flytune_warmup_background_starts_the_bundles_warmup_when_its_kernel_registers(installed, tmp_path):  # noqa: F811
    site = installed()
    script = textwrap.dedent("""
        import json, torch
        import fixpkg
        from flytune_build.runtime.warming import warmup
        auto = warmup.auto()
        assert auto is not None and auto.wait(120)
        report = auto.reports["fixpkg"]
        x = torch.randn(100)
        d = fixpkg.add_kernel.decision(x, x, x, 100)
        print(json.dumps({"primed": sum(u.primed for u in report.units), "tier": d and d.tier}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False,
                       env=python_env(PYTHONPATH=site, TRITON_INTERPRET=1, FLYTUNE_WARMUP="background",
                                      FLYTUNE_CACHE_DIR=tmp_path / "fresh-scratch"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == '{"primed": 2, "tier": "offline"}'
    off = "import fixpkg; from flytune_build.runtime import warmup; print(warmup.auto())"
    r = subprocess.run([sys.executable, "-c", off], capture_output=True, text=True, check=False,
                       env=python_env(PYTHONPATH=site, TRITON_INTERPRET=1))
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr  # off unless asked for


def test_a_bad_flytune_warmup_value_names_the_variable():
    with pytest.raises(SettingsError, match="FLYTUNE_WARMUP"):
        settings.read({"FLYTUNE_WARMUP": "foreground"})
    assert settings.read({"FLYTUNE_WARMUP": "background"}).warmup == "background"
    assert settings.read({}).warmup == settings.read({"FLYTUNE_WARMUP": "0"}).warmup == "off"


def _backend():
    from triton.backends.compiler import BaseBackend

    return BaseBackend


def _bind(jit, spec, config):
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(jit.signature, jit.params, _backend())
    named = binder.stand_ins(spec, config, exclude=set(config.kwargs))
    return bind(**named, **config.launch_kwargs(), debug=False, instrumentation_mode="")


# -- an adopted @triton.autotune kernel: its tuned keys go into its Autotuner's cache ahead ------------------
ADOPTED = '''
import triton
import triton.language as tl
import flytune_build.triton

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

flytune_build.triton.adopt(add_kernel, name="adoptpkg.add")

def add(x, y):
    out = x.new_empty(x.shape)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''


# the same kernel as libraries often write it: the @triton.jit function apart, wrapped later (the recorded
# specialization names `_add`, not the Autotuner's attribute)
WRAPPED_LATER = ADOPTED.replace('@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], '
                                'key=["n"])\n@triton.jit\ndef add_kernel(', '@triton.jit\ndef _add(').replace(
    'flytune_build.triton.adopt(', 'add_kernel = triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) '
    'for b in (16, 32, 64)], key=["n"])(_add)\nflytune_build.triton.adopt(')


@pytest.fixture(params=["decorated", "wrapped later"])
def adopted_site(tmp_path, monkeypatch, request):
    """`adoptpkg`: an adopted kernel whose searches (recorded, synthetic ranking) were bundled by the build
    pipeline, installed as a distribution on sys.path."""
    import io

    from buildkit import H200, pyproject

    from flytune_build.core.artifact import Artifact

    from flytune_build import pipeline
    from flytune_build.pipeline import directory
    from flytune_build.triton import recording

    proj, site = tmp_path / "proj", tmp_path / "site"
    (proj / "adoptpkg").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(pyproject().replace("fixpkg", "adoptpkg"))
    source = ADOPTED if request.param == "decorated" else WRAPPED_LATER
    assert ("key=[\"n\"])(_add)" in source) == (request.param == "wrapped later")
    (proj / "adoptpkg" / "__init__.py").write_text(source)
    shutil.copytree(proj / "adoptpkg", site / "adoptpkg")
    sys.path.insert(0, str(site))
    try:
        import adoptpkg
        with settings.override(ranking="synthetic"), recording(adoptpkg.add_kernel, "adoptpkg.add") as arts:
            for n in (100, 256):
                adoptpkg.add(torch.randn(n), torch.randn(n))
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.split(".")[0] == "adoptpkg"]:
            sys.modules.pop(name)
    assert len(arts) == 2 and all("specialization" in a.provenance for a in arts)
    for a in arts:   # the interpreter's, and the H200 the project targets too
        a.save(proj / "artifacts")
        Artifact(a.kernel, a.key, H200, a.config, a.provenance).save(proj / "artifacts")
    directory.write(pipeline.run(proj, out=io.StringIO()), site / "adoptpkg")
    info = site / "adoptpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: adoptpkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[flytune.bundles]\nadoptpkg = adoptpkg._flytune\n")
    monkeypatch.syspath_prepend(str(site))
    fresh_scratch(monkeypatch, tmp_path)
    yield {a.key["n"]: a.config for a in arts}
    for name in [m for m in sys.modules if m.split(".")[0] == "adoptpkg"]:
        sys.modules.pop(name)


def test_after_a_warmup_an_adopted_kernels_tuned_keys_are_in_its_autotuners_cache_before_any_call(adopted_site):
    report = warmup.warmup("adoptpkg")
    import adoptpkg

    k = adoptpkg.add_kernel
    assert report.ok and sum(u.primed for u in report.units) == 2, report.to_json()
    assert {key[0]: c.kwargs["BLOCK"] for key, c in k.cache.items()} == \
        {n: c.kwargs["BLOCK"] for n, c in adopted_site.items()}   # Triton's key: n, then each tensor's dtype
    decided = {key[0]: c for key, c in k.cache.items()}
    for n in (100, 256):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(adoptpkg.add(x, y), x + y)
        assert k.best_config is decided[n]   # the object put there ahead: nothing decided at the call
    assert {key[0]: c for key, c in k.cache.items()} == decided
    s = ft.stats()["adoptpkg.add"]
    assert s["calls"]["offline"] == 2 and s["calls"]["heuristic"] == 0 and s["searches"] == 0


def test_a_warmup_under_flytune_autotune_search_leaves_an_adopted_kernels_keys_to_their_calls(adopted_site, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    settings.reload()
    try:
        report = warmup.warmup("adoptpkg")
        import adoptpkg

        assert sum(u.primed for u in report.units) == 0 and not adoptpkg.add_kernel.cache
        assert any("chosen at its first call" in n for n in report.notes), report.notes
    finally:
        monkeypatch.setenv("FLYTUNE_AUTOTUNE", "0")
        settings.reload()
