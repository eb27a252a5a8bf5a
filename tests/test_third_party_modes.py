"""FLYTUNE_AUTOTUNE binds real third-party `@triton.autotune` kernels as it binds flytune's own, ported
(`flytune_build.autotune` over the library's `@triton.jit` function, its decorator arguments as they
are) and adopted (the library's Autotuner, under its `@triton.heuristics`) alike: liger-kernel's DyT
backward (`reset_to_zero`, an optional tensor passed as None), fla's causal-conv1d update
(`@triton.heuristics`, `restore_value`, None arguments, every argument by keyword) and fla's GLA dv
(`prune_configs_by`), vendored in tests/data/third_party. Every result is checked against torch."""
import importlib.util
import re
import sys
import warnings

import pytest
import torch
import triton
from conftest import ROOT

import flytune_build as ft
from flytune_build import Config, FlytuneWarning
from flytune_build import triton as adapter
from flytune_build.core.artifact import Artifact
from flytune_build.core.device import INTERPRETER
from flytune_build.core.errors import ArtifactExecutionError, TierMissError

KINDS = ("ported", "adopted")
VENDORED = ROOT / "tests" / "data" / "third_party" / "tp_kernels.py"


def vendored():
    """A fresh copy of the vendored module: a Triton Autotuner keeps its cache on the object."""
    spec = importlib.util.spec_from_file_location("tp_kernels", VENDORED)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tp_kernels"] = mod  # importable by name, as `flytune tune` records the launched function
    spec.loader.exec_module(mod)
    return mod


def make(kind, which, name):
    """The library's kernel `which`, adopted as it ships, or ported with its own decorator arguments."""
    k = getattr(vendored(), which)
    if kind == "adopted":
        adapter.adopt(k, name=name)
        return k
    tuner = k.fn if hasattr(k, "values") else k  # under @triton.heuristics
    extra = {a: getattr(tuner, a) for a in ("reset_to_zero", "restore_value") if getattr(tuner, a, None)}
    if tuner.early_config_prune is not None:
        extra["prune_configs_by"] = {"early_config_prune": tuner.early_config_prune}
    ported = ft.autotune(tuner.configs, key=list(tuner.keys), name=name, **extra)(tuner.fn)
    return triton.heuristics(k.values)(ported) if hasattr(k, "values") else ported


# -- host code, as the libraries launch these kernels, and torch references ------------------------
def dyt_bwd(k, N, beta=True, M=4, sms=4):
    g = torch.Generator().manual_seed(N)
    x, dy, gamma = torch.randn(M, N, generator=g), torch.randn(M, N, generator=g), torch.randn(N, generator=g)
    alpha, b = torch.tensor([0.7]), (torch.randn(N, generator=g) if beta else None)
    da = torch.zeros(sms, triton.cdiv(N, 512))
    dg, dx = torch.empty(sms, N), torch.empty_like(dy)
    db = torch.empty(sms, N) if beta else None
    k[lambda m: (triton.cdiv(N, m["BLOCK_N"]), sms)](dy, dx, da, dg, db, x, alpha, gamma, beta, M, N)
    xr, ar, gr = (t.clone().requires_grad_() for t in (x, alpha, gamma))
    br = b.clone().requires_grad_() if beta else None
    y = torch.tanh(ar * xr) * gr + (br if beta else 0)
    y.backward(dy)
    ok = [torch.allclose(dx, xr.grad, atol=1e-4), torch.allclose(da.sum().reshape(1), ar.grad, atol=1e-3),
          torch.allclose(dg.sum(0), gr.grad, atol=1e-4)]
    return all(ok) and (not beta or torch.allclose(db.sum(0), br.grad, atol=1e-4))


def conv_update(k, D, extras=True, N=3, W=4):
    g = torch.Generator().manual_seed(D + W)
    x, cache, weight = torch.randn(N, D, generator=g), torch.randn(N, D, W, generator=g), torch.randn(D, W, generator=g)
    residual = torch.randn(N, D, generator=g) if extras else None
    bias = torch.randn(D, generator=g) if extras else None
    c_ref = torch.cat([cache[:, :, 1:], x[:, :, None]], dim=-1)
    y_ref = torch.nn.functional.silu((c_ref * weight).sum(-1) + (bias if extras else 0)) + (residual if extras else 0)
    y = torch.empty_like(x)
    k[lambda m: (triton.cdiv(D, m["BD"]) * N,)](
        x=x, cache=cache, residual=residual, y=y, weight=weight, bias=bias, stride_x_n=x.stride(0),
        stride_x_d=x.stride(1), stride_y_n=y.stride(0), stride_y_d=y.stride(1), D=D, W=W,
        BW=triton.next_power_of_2(W), ACTIVATION="silu")
    return torch.allclose(y, y_ref, atol=1e-5) and torch.allclose(cache, c_ref)  # the cache is updated once


def gla_dv(k, K, B=1, T=40, H=2, V=32, BT=16):
    g = torch.Generator().manual_seed(K)
    NT = triton.cdiv(T, BT)
    kk, do = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, V, generator=g)
    gk = -torch.rand(B, T, H, K, generator=g).cumsum(1) * 0.1
    A, dh = torch.randn(B, T, H, BT, generator=g), torch.randn(B, NT, H, K, V, generator=g)
    dv = torch.empty_like(do)
    k[lambda m: (triton.cdiv(V, m["BV"]) * NT, B * H)](
        k=kk, g=gk, A=A, do=do, dh=dh, dv=dv, cu_seqlens=None, chunk_indices=None, T=T, H=H, K=K, V=V, BT=BT,
        STATE_V_FIRST=False)
    ref = torch.zeros_like(do)
    for i, s in enumerate(range(0, T, BT)):
        e = min(s + BT, T)
        a = A[:, s:e, :, :e - s].permute(0, 2, 3, 1) * torch.tril(torch.ones(e - s, e - s)).T.bool()
        ref[:, s:e] = torch.einsum("bhji,bihv->bjhv", a, do[:, s:e])
        ref[:, s:e] += torch.einsum("bthk,bhkv->bthv", kk[:, s:e] * torch.exp2(gk[:, e - 1][:, None] - gk[:, s:e]),
                                    dh[:, i])
    return torch.allclose(dv, ref, atol=1e-3, rtol=1e-3)


CASES = {  # kernel: (vendored attribute, call, tuned shape, untuned shape, a config the kernel cannot launch)
    "dyt_bwd": ("_dyt_bwd_kernel", dyt_bwd, 256, 512, {"BLOCK_N": 3}),
    "conv_update": ("causal_conv1d_update_kernel", conv_update, 32, 64, {"BD": 3}),
    "gla_dv": ("chunk_gla_bwd_kernel_dv", gla_dv, 32, 16, {"BK": 3, "BV": 16}),
}


def artifact_key(kind, case, shape):
    """The key a call of `case` at `shape` is served under, as `flytune tune` writes it."""
    f32 = "float32"
    if case == "dyt_bwd":
        tensors = dict.fromkeys(("DY", "DX", "DA", "DG", "DB", "X", "Alpha", "Gamma"), f32)
        return {"N": shape} if kind == "ported" else {"N": shape, **tensors}
    if case == "conv_update":
        tensors = dict.fromkeys(("x", "cache", "residual", "y", "weight", "bias"), f32)
        return {"D": shape, "W": 4} if kind == "ported" else {"D": shape, "W": 4, **tensors}
    key = {"BT": 16, "STATE_V_FIRST": False, "K": shape, "V": 32}
    tensors = {**dict.fromkeys(("k", "g", "A", "do", "dh", "dv"), f32), "cu_seqlens": None, "chunk_indices": None}
    return key if kind == "ported" else {**key, **tensors}


def first_declared(case):
    tuner = getattr(vendored(), CASES[case][0])
    tuner = tuner.fn if hasattr(tuner, "values") else tuner
    return Config.coerce(tuner.configs[-1])  # the last declared: never the "first config" fallback


def bundle(tmp_path, monkeypatch, kind, case, name, config=None, shape=None):
    d = tmp_path / "artifacts"
    shape = CASES[case][2] if shape is None else shape
    Artifact(name, artifact_key(kind, case, shape), INTERPRETER, config or first_declared(case)).save(d)
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(d))
    ft.reset_stats()


def counts(name):
    s = ft.stats()[name]
    return s["calls"], s["searches"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["0", "auto", "strict"])
def test_a_real_kernels_tuned_key_is_served_offline_with_no_search_in_every_mode_that_reads_bundles(
        tmp_path, monkeypatch, mode, kind, case):
    name = f"tp.{kind}.{case}"
    bundle(tmp_path, monkeypatch, kind, case, name)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", mode)
    attr, call, tuned, _, _ = CASES[case]
    k = make(kind, attr, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlytuneWarning)
        assert call(k, tuned) and call(k, tuned)
    calls, searches = counts(name)
    assert searches == 0 and calls["offline"] == 2 and sum(calls.values()) == 2, calls


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_an_untuned_key_of_a_real_kernel_under_0_takes_the_first_config_with_one_warning(tmp_path, monkeypatch,
                                                                                          kind, case):
    name = f"tp.{kind}.{case}"
    bundle(tmp_path, monkeypatch, kind, case, name)
    attr, call, _, untuned, _ = CASES[case]
    k = make(kind, attr, name)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert call(k, untuned) and call(k, untuned)
    said = [str(w.message) for w in got if issubclass(w.category, FlytuneWarning)]
    assert said == [f"flytune: kernel {name}: FLYTUNE_AUTOTUNE=0 and no heuristic default: using the first config"]
    calls, searches = counts(name)
    assert searches == 0 and calls["heuristic"] == 2, calls


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_an_untuned_key_of_a_real_kernel_under_strict_raises_tier_miss_naming_kernel_and_key(tmp_path, monkeypatch,
                                                                                              kind, case):
    name = f"tp.{kind}.{case}"
    bundle(tmp_path, monkeypatch, kind, case, name)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    attr, call, tuned, untuned, _ = CASES[case]
    k = make(kind, attr, name)
    assert call(k, tuned)
    axis = {"dyt_bwd": "'N': 512", "conv_update": "'D': 64", "gla_dv": "'K': 16"}[case]
    with pytest.raises(TierMissError, match=rf"kernel {name}: Field `key` has no tuned config for key \{{.*{axis}.*\}} "
                                            r"on device interpreter: FLYTUNE_AUTOTUNE=strict forbids"):
        call(k, untuned)
    assert counts(name)[1] == 0


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_real_kernel_under_1_searches_even_a_bundled_key_and_its_hooks_keep_the_result_right(
        tmp_path, monkeypatch, kind, case):
    """reset_to_zero (DyT's DA), restore_value (conv's cache, updated in place) and the pruner run in the
    search: the caller's result is computed once, right."""
    name = f"tp.{kind}.{case}"
    bundle(tmp_path, monkeypatch, kind, case, name)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    monkeypatch.setenv("FLYTUNE_EMIT_DIR", str(tmp_path / "emit"))
    attr, call, tuned, _, _ = CASES[case]
    k = make(kind, attr, name)
    assert call(k, tuned)
    calls, searches = counts(name)
    assert searches == 1 and calls["offline"] == 0, calls
    (art,) = [Artifact.load(p) for p in (tmp_path / "emit").glob("*.json")]
    assert art.kernel == name and art.key == artifact_key(kind, case, tuned)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_an_owners_artifact_a_real_kernel_cannot_launch_is_loud_and_serves_no_call(tmp_path, monkeypatch,
                                                                                   kind, case):
    name = f"tp.{kind}.{case}"
    attr, call, tuned, _, broken = CASES[case]
    bundle(tmp_path, monkeypatch, kind, case, name, config=Config(broken))
    k = make(kind, attr, name)
    with pytest.raises(ArtifactExecutionError, match="failed to compile or launch with the accepted artifact"):
        call(k, tuned)
    calls, searches = counts(name)
    assert sum(calls.values()) == 0 and searches == 0, calls  # a launch that failed served nothing


# -- the same rules through installed bundles (tests/test_ownership.py's site) -------------------------
from test_ownership import KERNEL_NAME, install, owner_project, pack_project, served, site  # noqa: E402,F401


def test_a_ported_kernels_pack_config_that_fails_to_launch_counts_the_call_once(tmp_path, site, monkeypatch):
    """One call: the pack's config fails (refused, one warning), the heuristic serves it. It counts
    once, for the heuristic, as an adopted kernel counts it, not also as an offline call."""
    install(site, owner_project(tmp_path), "ownpkg")
    install(site, pack_project(tmp_path, blocks=((200, 48),)), "Vendor_Configs")
    monkeypatch.setenv("FLYTUNE_PACKS", "*")
    with pytest.warns(FlytuneWarning, match="failed to launch .*refused"):
        assert served(200) == ("heuristic", 16, None)
    calls = ft.stats()[KERNEL_NAME]["calls"]
    assert calls["offline"] == 0 and calls["heuristic"] == 1, calls


def test_an_adopted_kernels_rejected_bundled_artifact_is_named_in_its_warning(tmp_path, site, monkeypatch):
    """A bundle's artifact that does not bind to an adopted kernel (its config sets no parameter of the
    kernel) is refused with one warning that names the artifact's file, as a ported kernel's does."""
    from test_ownership import ADOPTED_SOURCE, PKG, adopted_key, project

    bad = Artifact(KERNEL_NAME, adopted_key(100), INTERPRETER, Config({"NOT_A_PARAMETER": 16}))
    install(site, project(tmp_path / "owner", "ownpkg", PKG, [bad], "", ADOPTED_SOURCE), "ownpkg")
    with pytest.warns(FlytuneWarning, match=rf"artifact {re.escape(bad.filename)} from ownpkg bundle rejected"):
        importlib.import_module(PKG)
