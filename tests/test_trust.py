"""Winners you can trust, end to end: the output check never makes a kernel untunable (kernels launched
inside autograd are tuned and checked), no run keeps or ships winners ranked another way without saying
so, a config edited after its search is caught without a GPU, and the report never draws a synthetic
rank as a time."""
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from buildkit import tune_pyproject
from conftest import ROOT, python_env

import flytune_build as ft
from flytune_build import pipeline
from flytune_build.audit import source as audit
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.config import Config
from flytune_build.dist.wheel import record_hash

PKG = "trustpkg"

# `back` is the kernel of Scale's backward; its BLOCK=32 config adds 1, so a check that runs rejects it.
KERNELS = '''
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

def _configs():
    return [Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]

@ft.autotune(_configs(), ["n"], name="trustpkg.scale")
@triton.jit
def scale_kernel(x, out, n, sx, BLOCK: tl.constexpr):   # out = 2 x (x read with stride sx)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs * sx, mask=m) * 2.0, mask=m)

@ft.autotune(_configs(), ["n"], name="trustpkg.back")
@triton.jit
def back_kernel(g, dx, n, sg, BLOCK: tl.constexpr):   # dx = 2 g; BLOCK=32 is wrong
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(g + offs * sg, mask=m) * 2.0
    if BLOCK == 32:
        v = v + 1.0
    tl.store(dx + offs, v, mask=m)

@ft.autotune(_configs(), ["n"], name="trustpkg.addin")
@triton.jit
def addin_kernel(x, y, n, BLOCK: tl.constexpr):   # x += y, in place
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)

class Scale(torch.autograd.Function):
    """y = 2 x, a tuned kernel in forward and another in backward, as a fused training op launches them."""

    @staticmethod
    def forward(ctx, x):
        flat = x.view(-1)              # a view made in no_grad mode (forward runs without grad)
        ctx.save_for_backward(flat)    # saved: an in-place bump of its version fails the backward
        out = torch.empty_like(flat)
        scale_kernel[_grid(flat.numel())](flat, out, flat.numel(), 1)
        return out.view_as(x)

    @staticmethod
    def backward(ctx, g):
        (flat,) = ctx.saved_tensors
        g = g.reshape(-1)              # the gradient of a sum: an expanded scalar (stride 0)
        dx = torch.empty(g.shape, dtype=g.dtype)
        back_kernel[_grid(g.numel())](g, dx, g.numel(), g.stride(0))
        return dx.view_as(flat)

class ScaleAlone(torch.autograd.Function):
    """Scale's forward, its backward in plain torch: the one tuned kernel of the op."""

    forward = Scale.forward

    @staticmethod
    def backward(ctx, g):
        (flat,) = ctx.saved_tensors
        return (2 * g + 0 * flat).view_as(flat)

class AddIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        addin_kernel[_grid(x.numel())](x, y, x.numel())
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g

def _train(n, create_graph):
    def run():
        w = torch.arange(n, dtype=torch.float32).requires_grad_()
        Scale.apply(w * 1).sum().backward(create_graph=create_graph)
        assert torch.equal(w.grad.detach(), torch.full((n,), 2.0)), w.grad
    return run

def train(n):
    return _train(n, False)

def train_graph(n):   # backward with grad mode on
    return _train(n, True)

def train_alone(n):
    def run():
        w = torch.arange(n, dtype=torch.float32).requires_grad_()
        ScaleAlone.apply(w * 1).sum().backward()
        assert torch.equal(w.grad, torch.full((n,), 2.0)), w.grad
    return run

def leaf_view(n):     # a view of a leaf that requires grad, read by the kernel; the leaf saved by an earlier op
    def run():
        w = torch.arange(2 * n, dtype=torch.float32).requires_grad_()
        square = (w * w).sum()
        out = torch.empty(n)
        scale_kernel[_grid(n)](w[:n], out, n, 1)
        assert torch.equal(out, 2 * w.detach()[:n])
        square.backward()
        assert torch.equal(w.grad, 2 * w.detach())
    return run

def inference(n):     # tensors made under inference_mode, launched outside it
    def run():
        with torch.inference_mode():
            x, out = torch.arange(n, dtype=torch.float32), torch.empty(n)
        scale_kernel[_grid(n)](x, out, n, 1)
        assert torch.equal(out, 2 * x)
    return run

def inplace(n):       # an in-place Function (mark_dirty) on a tensor that requires grad
    def run():
        x, y = torch.arange(n, dtype=torch.float32).requires_grad_() * 1, torch.ones(n, requires_grad=True)
        AddIn.apply(x, y).sum().backward()
        assert torch.equal(y.grad, torch.ones(n))
    return run
'''
REFERENCE = '''
def scale(x, out, n, sx):
    out.copy_(2 * x.reshape(-1)[: n * sx : sx])
'''
WRONG = Config({"BLOCK": 32}, num_warps=1)   # trustpkg.back adds 1 with it


@pytest.fixture(autouse=True)
def _forget_trustpkg():
    """Each test's project is its own `trustpkg`: none is served from an earlier test's import."""
    yield
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]


def entry(kernel: str, setup: str, n: int, extra: str = "") -> str:
    return (f'{{ kernel = "{PKG}.{kernel}", setup = "{PKG}:{setup}", shapes = [{{ n = {n} }}]'
            + (f", {extra}" if extra else "") + " }")


TRAIN = (entry("scale", "train", 100), entry("back", "train", 100))


def project(root: Path, *entries: str) -> Path:
    (root / PKG).mkdir(parents=True)
    (root / PKG / "__init__.py").write_text(KERNELS)
    (root / PKG / "reference.py").write_text(REFERENCE)
    (root / "pyproject.toml").write_text(tune_pyproject(PKG, "entries = [" + ", ".join(entries) + "]"))
    return root


def tune(proj: Path, ranking: str, **kwargs):
    return ft.tune(proj, ranking=ranking, allow_ci=True, **kwargs)


def tune_cli(proj: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cli-cache")
    env.pop("FLYTUNE_RANKING", None)
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(proj), "--allow-ci",
                           "--no-progress", *args], capture_output=True, text=True, env=env, timeout=900,
                          check=False)


def out_of(proj: Path) -> Path:
    return proj / "artifacts" / "interpreter"


def artifacts(proj: Path) -> dict:
    return {(a.kernel, a.key["n"]): a for a in load_dir(out_of(proj))}


WHEEL = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def wheel_of(proj: Path, path: Path) -> Path:
    """The project's bundle in a minimal wheel (its package, entry point and a RECORD that matches)."""
    files = dict(pipeline.run(proj, out=io.StringIO()).files)
    files |= {f"{PKG}/__init__.py": b"", f"{PKG}-1.0.dist-info/entry_points.txt":
              f"[flytune.bundles]\n{PKG} = {PKG}._flytune\n".encode(), f"{PKG}-1.0.dist-info/WHEEL": WHEEL}
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{PKG}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**files, f"{PKG}-1.0.dist-info/RECORD": record.encode()}.items():
            zf.writestr(name, data)
    return path


# -- the output check never makes a kernel untunable ---------------------------------------------------------
def test_kernels_inside_an_autograd_function_are_tuned_and_checked_forward_and_backward(tmp_path):
    """Scale's forward (on a view made in no_grad mode, saved for backward) and backward (on an expanded
    gradient, with and without create_graph) each launch a tuned kernel from a setup that calls
    `.backward()`: every job is tuned, checked, and the backward's wrong config rejected. Before, the
    check's restore bumped the saved view's version and the backward failed with torch's `A view was
    created in no_grad mode ...`."""
    proj = project(tmp_path / "p", *TRAIN, entry("back", "train_graph", 101),
                   entry("scale", "train_alone", 103, 'reference = "trustpkg.reference:scale"'))
    report = tune(proj, "synthetic")
    assert [o.status for o in report.outcomes] == ["tuned"] * 4, [o.reason for o in report.outcomes]
    arts = artifacts(proj)
    assert set(arts) == {("trustpkg.scale", 100), ("trustpkg.back", 100), ("trustpkg.back", 101),
                         ("trustpkg.scale", 103)}
    for a in arts.values():
        checked = a.provenance["outputs"]
        assert "note" not in checked and ("reference" in checked or "function" in checked), checked
    assert arts["trustpkg.scale", 103].provenance["outputs"]["function"] == "trustpkg.reference:scale"
    for n in (100, 101):
        back = arts["trustpkg.back", n]
        assert back.provenance["outputs"]["rejected"] == 1 and back.config != WRONG
        (wrong,) = [c for c in back.provenance["candidates"] if Config.coerce(c["config"]) == WRONG]
        assert wrong["time_ms"] is None and wrong["error"].startswith("WrongOutput: `dx` differs"), wrong


def test_a_reference_function_checks_its_entry_s_kernel_only_not_the_backward_its_setup_also_searches(tmp_path):
    """The entry names a reference for the forward's kernel; the setup's backward searches another
    kernel, which the function does not compute: that search is checked against a config (its wrong
    BLOCK=32 still rejected), and the job is tuned, not failed with the function's error on the
    backward's arguments."""
    proj = project(tmp_path / "p", entry("scale", "train", 100, 'reference = "trustpkg.reference:scale"'))
    (o,) = tune(proj, "synthetic").outcomes
    assert o.status == "tuned", o.reason
    assert artifacts(proj)["trustpkg.scale", 100].provenance["outputs"]["function"] == "trustpkg.reference:scale"


@pytest.mark.parametrize("setup, kernel", [("leaf_view", "scale"), ("inference", "scale"), ("inplace", "addin")])
def test_a_call_on_tensors_autograd_tracks_is_checked_and_its_caller_runs_as_unchecked(tmp_path, setup, kernel):
    """A view of a leaf that requires grad (the leaf saved for backward by an earlier op), tensors made
    under inference_mode, an in-place Function on a tensor that requires grad: the setup's own asserts
    (the backward included) pass, and the job is checked, not tuned unchecked."""
    proj = project(tmp_path / "p", entry(kernel, setup, 100))
    (o,) = tune(proj, "synthetic").outcomes
    assert o.status == "tuned", o.reason
    (art,) = artifacts(proj).values()
    assert art.provenance["outputs"]["rejected"] == 0 and "note" not in art.provenance["outputs"]


# -- no run keeps, no verify passes, winners ranked another way ---------------------------------------------
def test_a_measured_run_never_resumes_a_synthetic_job_and_says_why(tmp_path):
    proj = project(tmp_path / "p", *TRAIN)
    assert tune(proj, "synthetic").ok
    r = tune_cli(proj, tmp_path, "--ranking", "measured")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: ranking changed (synthetic -> measured)" in r.stdout, \
        r.stdout
    assert {a.provenance["ranking"] for a in artifacts(proj).values()} == {"measured"}
    assert audit.verify(str(out_of(proj)), strict=True).ok

    r = tune_cli(proj, tmp_path, "--ranking", "measured")
    assert "0 tuned, 2 resumed" in r.stdout and "re-tuned" not in r.stdout, r.stdout
    report = tune(proj, "synthetic")   # and the other way round
    assert report.retuned() == {"ranking changed (measured -> synthetic)": 2}
    assert {a.provenance["ranking"] for a in artifacts(proj).values()} == {"synthetic"}


def test_a_folder_or_bundle_mixing_rankings_is_a_warning_and_a_strict_violation(tmp_path):
    """One kernel re-tuned measured beside another's synthetic winners for the same device: plain verify
    of the folder, the project and its wheel warns of each synthetic artifact, --strict refuses them."""
    proj = project(tmp_path / "p", *TRAIN)
    assert tune(proj, "synthetic").ok
    assert tune(proj, "measured", kernels=["trustpkg.scale"]).ok
    assert {k: a.provenance["ranking"] for k, a in artifacts(proj).items()} == \
        {("trustpkg.scale", 100): "measured", ("trustpkg.back", 100): "synthetic"}
    wheel = wheel_of(proj, tmp_path / f"{PKG}-1.0-py3-none-any.whl")
    for path in (out_of(proj), proj, wheel):
        plain = audit.verify(str(path))
        assert plain.ok, plain.errors
        (warning,) = [w for w in plain.warnings if "rankings are mixed" in w]
        assert "trustpkg.back" in warning and "is synthetic, beside 1 measured artifact(s) for device interpreter" \
            in warning, warning
        strict = audit.verify(str(path), strict=True)
        assert not strict.ok and [e.field for e in strict.errors] == ["provenance.ranking"], strict.errors


def test_an_artifact_whose_config_is_not_the_winner_it_records_is_a_violation_of_plain_verify(tmp_path):
    """A config edited by hand after its search: plain verify (and the build) name the winner its
    provenance records; one chosen by hand says why (`by_hand`), and one written by hand records no
    search: neither is flagged."""
    proj = project(tmp_path / "p", *TRAIN)
    assert tune(proj, "synthetic").ok
    art = artifacts(proj)["trustpkg.scale", 100]
    other = next(Config.coerce(c["config"]) for c in art.provenance["candidates"]
                 if Config.coerce(c["config"]) != art.config)
    measured = {**art.provenance, "ranking": "measured", "measurement": {"timer": "cpu-time"}}
    Artifact(art.kernel, art.key, art.device, other, measured).save(out_of(proj))   # same identity: same file
    for path in (out_of(proj), proj):
        src = audit.verify(str(path))
        (e,) = [e for e in src.errors if e.field == "config"]   # a project's coverage then misses it too
        assert "but its provenance's selection chose candidate #" in e.rule, e
        assert str(art.config) in e.rule and str(other) in e.rule

    Artifact(art.kernel, art.key, art.device, other, {**measured, "by_hand": "BLOCK=32 wins on H200s"}) \
        .save(out_of(proj))
    assert audit.verify(str(out_of(proj))).ok
    Artifact(art.kernel, art.key, art.device, other, {"ranking": "measured", "triton": "3.6.0"}).save(out_of(proj))
    hand = audit.verify(str(out_of(proj)))
    assert hand.ok and not hand.warnings, hand.warnings


def test_plain_verify_of_a_bundle_with_no_artifact_warns_and_strict_refuses_it(tmp_path):
    proj = tmp_path / "p"
    (proj / PKG).mkdir(parents=True)
    (proj / PKG / "__init__.py").write_text("")
    (proj / "artifacts").mkdir()
    (proj / "pyproject.toml").write_text(f'[project]\nname = "{PKG}"\nversion = "1.0"\n\n[tool.flytune]\n'
                                         f'sources = ["artifacts"]\ntargets = ["interpreter"]\ncoverage = "none"\n')
    wheel = wheel_of(proj, tmp_path / f"{PKG}-1.0-py3-none-any.whl")
    for path in (proj, wheel):
        plain = audit.verify(str(path))
        assert plain.ok and any("holds a bundle with no artifact: it serves nothing" in w for w in plain.warnings), \
            plain.warnings
        assert not audit.verify(str(path), strict=True).ok


def test_earlier_releases_and_harvests_verify_exactly_as_before():
    """The new rules leave what earlier releases wrote alone: the compat corpus (whose first releases mix
    an adopted kernel's measured winners with synthetic ones, recording no measurement) and an Inductor
    harvest whose coordinate descent shipped a config none of its candidates."""
    corpus = ROOT / "tests" / "data" / "compat"
    dirs = [corpus / "src" / "artifacts" / "interpreter", *sorted(corpus.glob("releases/*/synthetic")),
            *sorted(corpus.glob("releases/*/measured")), *sorted(corpus.glob("releases/*/wheels/*/*.whl"))]
    for path in dirs:
        src = audit.verify(str(path), strict=True)
        assert src.ok and not src.warnings, (path, src.errors, src.warnings)
    assert audit.verify(str(ROOT / "tests" / "data" / "inductor" / "h200-ma")).ok


# -- the report draws ranks as ranks ---------------------------------------------------------------------------
TIME_WORDS = re.compile(r"time per config, ms|rounds, ms|% faster|% slower|\d% \(new vs old run\)")


def test_the_report_labels_a_synthetic_ranking_as_ranks_never_as_milliseconds_or_speed_ups(tmp_path):
    from flytune_build import review

    html = review.render(str(ROOT / "sample_pkg" / "artifacts" / "interpreter"))   # synthetic
    assert "synthetic rank per config, not a time" in html
    assert not TIME_WORDS.search(html), TIME_WORDS.search(html)
    assert re.search(r'class="value[^"]*">rank \d', html)

    proj = project(tmp_path / "p", *TRAIN)
    assert tune(proj, "synthetic").ok
    new = tmp_path / "new"
    shutil.copytree(out_of(proj), new)
    art = artifacts(proj)["trustpkg.back", 100]
    other = next(Config.coerce(c["config"]) for c in art.provenance["candidates"]
                 if c["time_ms"] is not None and Config.coerce(c["config"]) != art.config)
    Artifact(art.kernel, art.key, art.device, other, art.provenance).save(new)
    html = review.render(str(out_of(proj)), str(new))
    assert "by synthetic rank, not time: " in html   # the selection's why, its gains said as ranks
    assert 'data-role="changed"' in html and "(synthetic rank " in html and "not a time" in html
    assert "none: the runs rank synthetically" in html
    assert not TIME_WORDS.search(html), TIME_WORDS.search(html)
