"""`@triton.autotune` kernels get the offline tier through adopt(); recording() captures their winners."""
import pytest
import torch
import triton
import triton.language as tl

from buildkit import tune_pyproject
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.core.errors import FlytuneWarning
from flytune_build.runtime.serving import autotuner

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]
calls = []


def do_bench(fn, quantiles=None):
    calls.append(fn)
    fn()
    return [float(len(calls))] * 3  # deterministic: the first candidate is fastest


def make():
    @triton.autotune(configs=CONFIGS, key=["n"], do_bench=do_bench)
    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
    return add


def call(k, n, dtype=torch.float32):
    x, y, out = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype), torch.empty(n, dtype=dtype)
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n)
    assert torch.equal(out, x + y)


@pytest.fixture
def bundle_dir(tmp_path, monkeypatch):
    d = tmp_path / "arts"
    key = {"n": 100, "x": "float32", "y": "float32", "out": "float32"}
    Artifact("ext.add", key, INTERPRETER, Config({"BLOCK": 64}, num_warps=2)).save(d)
    Artifact("ext.add", {**key, "n": 200}, DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132),
             Config({"BLOCK": 32})).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    autotuner.reset_stats()
    return d


def test_adopted_kernel_benchmarks_nothing_on_tuned_shapes(bundle_dir):
    k = make()
    assert adapter.adopt(k, name="ext.add") == 1
    calls.clear()
    call(k, 100)
    assert calls == [] and k.best_config.kwargs == {"BLOCK": 64} and k.best_config.num_warps == 2


@pytest.mark.parametrize("hits", [True, False])
def test_a_callers_mistake_on_a_seeded_key_is_the_callers_error_not_the_artifacts(bundle_dir, hits):
    """Passing `num_warps` (the served config sets it) raised an ArtifactExecutionError naming the accepted
    artifact, on a memo hit and on Triton's path alike; Triton's own TypeError now, noted as the call's."""
    from flytune_build.core.errors import ArtifactExecutionError

    k = make()
    adapter.adopt(k, name="ext.add")
    if hits:
        call(k, 100)   # remembered: the next call is a memo hit
    x = torch.randn(100)
    with pytest.raises(TypeError) as e:
        k[(2,)](x, x, torch.empty(100), 100, num_warps=8)
    assert not isinstance(e.value, ArtifactExecutionError)
    assert any("the call's own error, not the accepted artifact ext.add-" in n for n in e.value.__notes__)


def test_adopting_again_under_another_name_reports_the_kernel_once(bundle_dir):
    import flytune_build as ft
    from flytune_build.runtime.serving import registry

    k = make()
    adapter.adopt(k, name="t.adopted")
    adapter.adopt(k, name="t.renamed")
    assert registry.kernel("t.adopted") is None and registry.kernel("t.renamed") is not None
    call(k, 64)
    assert "t.adopted" not in ft.stats() and "t.renamed" in ft.stats()


def test_untuned_shapes_behave_as_before(bundle_dir, monkeypatch):
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")  # where search is allowed (=0 never searches)
    k = make()
    adapter.adopt(k, name="ext.add")
    calls.clear()
    call(k, 150)
    assert len(calls) == len(CONFIGS)
    calls.clear()
    call(k, 100, dtype=torch.float16)  # other dtypes are other Triton keys
    assert len(calls) == len(CONFIGS)


def test_other_device_seeds_nothing(bundle_dir, monkeypatch):
    monkeypatch.setenv("FLYTUNE_DEVICE", "hip:gfx942:304:AMD Instinct MI300X")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "auto")  # where search is allowed (=0 never searches)
    autotuner.reset_stats()
    k = make()
    with pytest.warns(FlytuneWarning, match="no artifact matches this device") as seen:
        assert adapter.adopt(k, name="ext.add") == 0 and k.cache == {}
    assert seen[0].filename == __file__  # the adopting line, not flytune's or triton's
    calls.clear()
    call(k, 100)
    assert len(calls) == len(CONFIGS)


def test_a_second_recording_block_on_one_kernel_is_refused_and_leaves_the_first_whole():
    """A `recording` block patches the Autotuner itself: a second one on the same kernel (nested here; on
    another thread alike) is a UsageError, and the first records and restores as if it were alone."""
    from flytune_build.core.errors import UsageError

    k = make()
    run = k.run
    with adapter.recording(k, name="ext.add") as captured:
        with pytest.raises(UsageError, match="already being recorded"):
            with adapter.recording(k, name="ext.add"):
                pass
        call(k, 300)
    assert len(captured) == 1 and k.run == run
    with adapter.recording(k, name="ext.add") as again:   # the kernel is free again
        call(k, 200)
    assert len(again) == 1


def test_recording_captures_winners_that_adopt_serves(tmp_path, monkeypatch):
    k = make()
    with adapter.recording(k, name="ext.add") as captured:
        calls.clear()
        call(k, 300)
        call(k, 300)  # a cache hit: nothing new
    assert len(captured) == 1
    art = captured[0]
    assert art.key == {"n": 300, "x": "float32", "y": "float32", "out": "float32"}
    assert art.config == Config({"BLOCK": 16}, num_warps=1) and len(art.provenance["candidates"]) == len(CONFIGS)
    assert art.provenance["ranking"] == "measured" and art.provenance["triton"] == triton.__version__
    art.save(tmp_path / "cap")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "cap"))
    autotuner.reset_stats()
    fresh = make()
    assert adapter.adopt(fresh, name="ext.add") == 1
    calls.clear()
    call(fresh, 300)
    assert calls == []


def test_adopt_refuses_non_autotuner():
    with pytest.raises(Exception, match="@triton.autotune"):
        adapter.adopt(object(), name="x.y")


def test_flytune_tune_captures_a_triton_autotune_kernel(tmp_path):
    import subprocess
    import sys

    from conftest import python_env

    proj = tmp_path / "ext"
    (proj / "extpkg").mkdir(parents=True)
    (proj / "extpkg" / "__init__.py").write_text('''
import torch, triton, triton.language as tl

def _bench(fn, quantiles=None):
    fn()
    return [1.0 + 0.1 * len(_seen.setdefault(id(fn), [1])), 1.0, 1.0]
_seen = {}

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"], do_bench=_bench)
@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + tl.load(y + offs, mask=offs < n), mask=offs < n)

def setup(n):
    x = torch.randn(n); y = torch.randn(n); out = torch.empty(n)
    return lambda: add[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n)
''')
    (proj / "pyproject.toml").write_text(tune_pyproject("extpkg", 'entries = [{ kernel = "extpkg.add", setup = '
                                                        '"extpkg:setup", autotuner = "extpkg:add", shapes = '
                                                        '[{ n = 100 }, { n = 200 }] }]', output=None))
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(proj), "--allow-ci",
                        "--no-progress"], capture_output=True, text=True,
                       env=python_env(TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-2000:]
    arts = [Artifact.load(p) for p in sorted((proj / "artifacts").glob("*.json"))]
    assert sorted(a.key["n"] for a in arts) == [100, 200]
    assert all(a.key["x"] == "float32" and a.provenance["candidates"] for a in arts)


def test_a_rocm_kernels_launch_keywords_are_recorded_and_seeded(tmp_path, monkeypatch):
    """ROCm `@triton.autotune` kernels tune `waves_per_eu`, `matrix_instr_nonkdim`, `kpack` in the
    configs' kwargs: recording keeps them in the artifact and `adopt` seeds the winner with them."""
    rocm = [triton.Config({"BLOCK": b, "waves_per_eu": w, "matrix_instr_nonkdim": 16, "kpack": 2}, num_warps=4)
            for b in (32, 64) for w in (0, 2)]

    @triton.autotune(configs=rocm, key=["n"], do_bench=do_bench)
    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    calls.clear()
    with adapter.recording(add, "ext.rocm") as captured:
        call(add, 100)
    (art,) = captured
    assert art.config.kwargs == {"BLOCK": 32, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 2}
    art.save(tmp_path / "arts")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "arts"))
    autotuner.reset_stats()
    assert adapter.adopt(add, name="ext.rocm") == 1
    calls.clear()
    call(add, 100)
    assert calls == [] and add.best_config.all_kwargs()["kpack"] == 2


def test_tensors_passed_by_keyword_in_any_order_are_served_without_search(tmp_path, monkeypatch):
    """Triton keys dtypes in the order the call passed its tensors; the artifact key is by name. A call
    whose Triton key was not seeded but whose artifact key was is seeded on its miss, not searched."""
    key = {"n": 100, "x": "float16", "y": "float32", "out": "float32"}
    Artifact("ext.kw", key, INTERPRETER, Config({"BLOCK": 64}, num_warps=2)).save(tmp_path / "arts")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "arts"))
    autotuner.reset_stats()
    k = make()
    assert adapter.adopt(k, name="ext.kw") == 1
    x, y, out = torch.randn(100, dtype=torch.float16), torch.randn(100), torch.empty(100)
    calls.clear()
    for _ in range(2):
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](out=out, y=y, x=x, n=100)
        assert torch.allclose(out, x.float() + y)
    assert calls == [] and k.best_config.kwargs == {"BLOCK": 64}
    import flytune_build as ft
    assert ft.stats()["ext.kw"]["calls"]["offline"] == 2 and ft.stats()["ext.kw"]["searches"] == 0
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")  # an order never seen is no miss in strict mode either
    k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](y=y, out=out, x=x, n=100)
    assert calls == []


def test_key_names_a_call_leaves_out_are_left_out_as_triton_does(tmp_path, monkeypatch):
    """Triton keys on the key arguments passed: a key name that is no parameter (fla's `"BT"`) or a
    defaulted parameter the call omits is skipped. Recording and `adopt` agree: the artifact is served."""
    @triton.autotune(configs=CONFIGS, key=["n", "BT", "scale"], do_bench=do_bench)
    @triton.jit
    def scaled(x, y, out, n, scale=2.0, BLOCK: tl.constexpr = 16):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, (tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)) * scale, mask=m)

    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    grid = lambda m: (triton.cdiv(100, m["BLOCK"]),)  # noqa: E731
    with adapter.recording(scaled, "ext.optional") as captured:
        scaled[grid](x, y, out, 100)
    (art,) = captured
    assert "BT" not in art.key and "scale" not in art.key
    art.save(tmp_path / "arts")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "arts"))
    autotuner.reset_stats()
    assert adapter.adopt(scaled, name="ext.optional") == 1
    calls.clear()
    scaled[grid](x, y, out, 100)
    assert calls == [] and torch.allclose(out, (x + y) * 2)
