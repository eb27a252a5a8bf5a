"""A plan entry's reference function (`reference = "module:function"`): every candidate's outputs are
compared with what it writes, called as the kernel is on the same inputs; a plan naming one that cannot
be used is refused before any job runs (exit 2); one that raises fails its job, never ships unchecked."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from buildkit import tune_pyproject
from conftest import python_env

from flytune_build.core import codec
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.errors import ArtifactError, PlanError, ProjectError, UsageError
from flytune_build.pipeline import reader
from flytune_build.runtime.searching import bench

# `refpkg.off` computes x + y + 1 with BLOCK=16, its first declared config (the reference without a
# function) and the one a synthetic ranking puts first: only a reference function can refuse it.
KERNELS = '''
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

KEPT_WRONG = tl.constexpr(32)

def _configs():
    return [Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]

@ft.autotune(_configs(), ["x", "n"], name="refpkg.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@ft.autotune(_configs(), ["x", "n"], name="refpkg.off")
@triton.jit
def off_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)
    if BLOCK == 16:
        v = v + 1.0
    tl.store(out + offs, v, mask=m)

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])
@triton.jit
def kept_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)
    if BLOCK == KEPT_WRONG:
        v = v + 1.0
    tl.store(out + offs, v, mask=m)

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"], restore_value=["x"])
@triton.jit
def kept_inplace_kernel(x, y, n, BLOCK: tl.constexpr):   # x += y
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"], reset_to_zero=["acc"])
@triton.jit
def kept_sum_kernel(x, acc, n, BLOCK: tl.constexpr):   # acc = sum(x), accumulated atomically
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(acc, tl.sum(tl.load(x + offs, mask=offs < n, other=0.0)))

def _zero_out(nargs):
    nargs["out"].zero_()

def _pruned(configs, nargs, **kwargs):   # BLOCK=16 is wrong; the configs it makes zero `out` first
    return [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=_zero_out) for b in (32, 64, 128)]

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"],
                 prune_configs_by={"early_config_prune": _pruned})
@triton.jit
def kept_pruned_kernel(x, out, n, BLOCK: tl.constexpr):   # out += x, atomically
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    if BLOCK == 16:
        v = v + 1.0
    tl.atomic_add(out + offs, v, mask=m)

@triton.heuristics({"EVEN": lambda a: a["n"] % 16 == 0})
@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])
@triton.jit
def kept_heuristic_kernel(x, y, out, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])
@triton.jit
def kept_asserting_kernel(x, y, out, n, BLOCK: tl.constexpr):   # BLOCK=32 fails to compile
    tl.static_assert(BLOCK != 32)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@triton.autotune([triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)], key=["n"])
@triton.jit
def kept_bias_kernel(x, bias, out, n, stride_bias, BLOCK: tl.constexpr):   # BLOCK=32 adds 1
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m) + tl.load(bias + offs * stride_bias, mask=m)
    if BLOCK == KEPT_WRONG:
        v = v + 1.0
    tl.store(out + offs, v, mask=m)

def kept_bias(n):   # a broadcast input: one element, expanded
    x, bias, out = torch.arange(n, dtype=torch.float32), torch.ones(1).expand(n), torch.full((n,), -1.0)
    return lambda: kept_bias_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, bias, out, n, bias.stride(0))

def _call(kernel, n):
    x, y, out = torch.arange(n, dtype=torch.float32), torch.ones(n), torch.full((n,), -1.0)
    return lambda: kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)

def add(n):
    return _call(add_kernel, n)

def off(n):
    return _call(off_kernel, n)

def kept(n):
    return _call(kept_kernel, n)

def kept_asserting(n):
    return _call(kept_asserting_kernel, n)

def kept_grad(n):   # an input that requires grad, as a training step's
    x, y, out = torch.arange(n, dtype=torch.float32).requires_grad_(), torch.ones(n), torch.full((n,), -1.0)
    return lambda: kept_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)

def kept_heuristic(n):
    return _call(kept_heuristic_kernel, n)

def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)

# setups that assert what the caller's tensors hold after the tuned call
def kept_add_result(n):
    def run():
        x, y, out = torch.arange(n, dtype=torch.float32), torch.ones(n), torch.full((n,), -1.0)
        kept_kernel[_grid(n)](x, y, out, n)
        assert torch.equal(out, x + y), f"out: {out[:4].tolist()}"
    return run

def kept_inplace_result(n):
    def run():
        x, y = torch.arange(n, dtype=torch.float32), torch.ones(n)
        kept_inplace_kernel[_grid(n)](x, y, n)
        assert torch.equal(x, torch.arange(n, dtype=torch.float32) + 1), f"x += y: {x[:4].tolist()}"
    return run

def kept_sum_result(n):
    def run():
        acc = torch.full((1,), 7.0)
        kept_sum_kernel[_grid(n)](torch.arange(n, dtype=torch.float32), acc, n)
        assert acc.item() == n * (n - 1) / 2, f"sum: {acc.item()}"
    return run

def kept_pruned_result(n):
    def run():
        x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), 5.0)
        kept_pruned_kernel[_grid(n)](x, out, n)
        assert torch.equal(out, x), f"out: {out[:4].tolist()}"
    return run
'''
REFERENCE = '''
def add(x, y, out, n):
    out.copy_(x + y)          # in place, as the kernel writes `out`

def boom(x, y, out, n):
    raise ValueError("no reference for n=%d" % n)

VALUE = 3
'''
OFF = Config({"BLOCK": 16}, num_warps=1)


@pytest.fixture(autouse=True)
def _forget_refpkg():
    """Each test's project is its own `refpkg`: none is served from an earlier test's import."""
    yield
    for name in [m for m in sys.modules if m == "refpkg" or m.startswith("refpkg.")]:
        del sys.modules[name]


def project(root: Path, *entries: str, plan: bool = False) -> Path:
    (root / "refpkg").mkdir(parents=True)
    (root / "refpkg" / "__init__.py").write_text(KERNELS)
    (root / "refpkg" / "reference.py").write_text(REFERENCE)
    tables = "\n".join(f"[[entries]]\n{e}\n" for e in entries)
    inline = "entries = [" + ", ".join("{ " + e.replace("\n", ", ") + " }" for e in entries) + "]"
    if plan:
        (root / "plan.toml").write_text(tables)
    (root / "pyproject.toml").write_text(tune_pyproject("refpkg", 'plan = "plan.toml"' if plan else inline))
    return root


def entry(kernel: str, extra: str = "") -> str:
    return f'kernel = "refpkg.{kernel}"\nsetup = "refpkg:{kernel}"\nshapes = [{{ n = 100 }}]' + (f"\n{extra}" if extra else "")


def tune(proj: Path, out: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / f"cache-{out.name}")
    env.pop("FLYTUNE_RANKING", None)
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(proj), "--output",
                           str(out), "--allow-ci", "--no-progress", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


def artifacts(out: Path) -> dict[str, Artifact]:
    return {a.kernel: a for a in (reader.load(str(p)) for p in sorted(out.glob("*.json")))}


def candidate(art: Artifact, config: Config) -> dict:
    return next(c for c in art.provenance["candidates"]
                if Config.from_json(c["config"], codec.Fields("t", ArtifactError)) == config)


def test_the_fastest_first_config_is_the_wrong_one():
    key = {"x": "float32", "n": 100}
    ranks = {b: bench.synthetic_ms("refpkg.off", key, Config({"BLOCK": b}, num_warps=1)) for b in (16, 32, 64)}
    assert ranks[16] < min(ranks[32], ranks[64])  # what the tests below rely on


@pytest.mark.parametrize("ranking", ["synthetic", "measured"])
def test_candidates_are_checked_against_the_reference_function_and_a_wrong_one_never_wins(tmp_path, ranking):
    out = tmp_path / "out"
    ref = 'reference = "refpkg.reference:add"'
    r = tune(project(tmp_path / "p", entry("add", ref), entry("off", ref)), out, tmp_path, "--ranking", ranking)
    assert r.returncode == 0, r.stderr[-3000:]
    arts = artifacts(out)
    agreed = arts["refpkg.add"].provenance
    assert agreed["outputs"] == {"function": "refpkg.reference:add", "rtol": None, "atol": None, "rejected": 0}
    assert all(c["time_ms"] is not None and "error" not in c for c in agreed["candidates"])
    off = arts["refpkg.off"]
    assert off.config != OFF and off.config.kwargs["BLOCK"] in (32, 64), r.stdout
    wrong = candidate(off, OFF)
    assert wrong["time_ms"] is None
    assert wrong["error"].startswith("WrongOutput: `out` differs from the reference function refpkg.reference:add's: "
                                     "100 of 100 elements (rtol 0.0001, atol 1e-05); first at [0]: 2 vs 1"), wrong
    assert off.provenance["outputs"] == {"function": "refpkg.reference:add", "rtol": None, "atol": None,
                                         "rejected": 1}
    assert all(f["index"] != 0 for f in off.provenance["selection"].get("finalists", []))  # never a finalist


def test_without_a_reference_function_the_first_config_is_the_reference_and_its_error_ships(tmp_path):
    """The case a reference function exists for: the default reference is itself wrong, so the right
    configs read as differing from it."""
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", entry("off")), out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 0, r.stderr[-3000:]
    art = artifacts(out)["refpkg.off"]
    assert art.config == OFF and art.provenance["outputs"]["reference"] == OFF.to_json()
    assert art.provenance["outputs"]["rejected"] == 2


def test_a_reference_function_travels_with_its_jobs_to_local_workers(tmp_path):
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", entry("off", 'reference = "refpkg.reference:add"')), out, tmp_path,
             "--ranking", "synthetic", "--executor", "local", "--workers", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    art = artifacts(out)["refpkg.off"]
    assert art.config != OFF and art.provenance["worker"] == "local:0"
    assert art.provenance["outputs"]["function"] == "refpkg.reference:add"


def test_a_reference_function_that_raises_fails_its_job_and_ships_nothing(tmp_path):
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:boom"'), entry("off")), out,
             tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stderr[-3000:]
    why = ("TuneError: the reference function refpkg.reference:boom raised on the call's inputs, so no candidate "
           "can be checked against it: ValueError: no reference for n=100")
    assert f"failed: refpkg.add n=100: {why}" in r.stdout, r.stdout
    assert set(artifacts(out)) == {"refpkg.off"}  # the other entry's job still ran


def test_a_changed_reference_function_re_tunes_its_jobs(tmp_path):
    out = tmp_path / "out"
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:add"'))
    assert tune(proj, out, tmp_path, "--ranking", "synthetic").returncode == 0
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert "0 tuned, 1 resumed" in r.stdout, r.stdout
    ref = proj / "refpkg" / "reference.py"
    ref.write_text(ref.read_text().replace("out.copy_(x + y)", "out.copy_(y + x)"))
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert "1 tuned, 0 resumed" in r.stdout and "re-tuned: output check changed" in r.stdout, r.stdout


def test_an_edit_beside_the_reference_function_re_tunes_too(tmp_path):
    """A helper the function calls is part of what it computes: the module's code is in the fingerprint."""
    out = tmp_path / "out"
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:add"'))
    assert tune(proj, out, tmp_path, "--ranking", "synthetic").returncode == 0
    ref = proj / "refpkg" / "reference.py"
    ref.write_text(ref.read_text().replace("VALUE = 3", "VALUE = 4"))
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert "1 tuned, 0 resumed" in r.stdout and "re-tuned: output check changed" in r.stdout, r.stdout


def test_a_call_the_check_cannot_cover_fails_its_job_where_a_reference_function_is_named(tmp_path):
    """Tensors over the check's cap (here lowered to 64 bytes) are tuned unchecked without a reference
    function, and fail the job with one: a plan that names one never ships an unchecked winner."""
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:add"'), entry("off"))
    init = proj / "refpkg" / "__init__.py"
    init.write_text(init.read_text() + "\nimport flytune_build.runtime.searching.outputs as _outputs\n_outputs.MAX_BYTES = 64\n")
    out = tmp_path / "out"
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("TuneError: the outputs cannot be checked against the reference function refpkg.reference:add: the "
            "call's tensors take 0.0 GiB, over 0 GiB") in r.stdout, r.stdout
    arts = artifacts(out)
    assert set(arts) == {"refpkg.off"} and arts["refpkg.off"].provenance["outputs"]["note"].startswith("not checked")


def test_what_a_setup_or_reference_prints_never_mixes_into_the_json_report(tmp_path):
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:add"'))
    init = proj / "refpkg" / "__init__.py"
    init.write_text(init.read_text().replace("def add(n):\n", "def add(n):\n    print('noise from the setup')\n"))
    ref = proj / "refpkg" / "reference.py"
    ref.write_text(ref.read_text().replace("    out.copy_(x + y)", "    print('noise from the reference')\n    out.copy_(x + y)"))
    r = tune(proj, tmp_path / "out", tmp_path, "--ranking", "synthetic", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["outcomes"]
    assert "noise from the setup" in r.stderr and "noise from the reference" in r.stderr


# -- refused before any job runs ------------------------------------------------------------------------------
@pytest.mark.parametrize("value, rule", [
    ('"refpkg.reference"', "must be `module:function` (dotted Python names), not 'refpkg.reference'"),
    ('"refpkg/reference.py:add"', "must be `module:function` (dotted Python names)"),
    ('"refpkg.reference:add.inner"', "must be `module:function` (dotted Python names)"),
    ("3", "must be a string, not an integer"),
    ('"refpkg.absent:add"', "names 'refpkg.absent:add', whose module refpkg.absent cannot be imported: "
                            "ModuleNotFoundError: No module named 'refpkg.absent'"),
    ('"refpkg.reference:nope"', "names 'refpkg.reference:nope', but module refpkg.reference has no nope"),
    ('"refpkg.reference:VALUE"', "names 'refpkg.reference:VALUE', which is int, not a function"),
])
def test_a_reference_that_cannot_be_used_is_refused_naming_its_field(tmp_path, value, rule):
    from flytune_build import tuning

    proj = project(tmp_path / "p", entry("add"), entry("off", f"reference = {value}"))
    out = tmp_path / "out"
    with pytest.raises(PlanError) as e:
        tuning.tune(proj, output=out, allow_ci=True, ranking="synthetic")
    assert isinstance(e.value, UsageError) and isinstance(e.value, ProjectError)
    assert (e.value.file, e.value.field) == (str(proj / "pyproject.toml"), "tool.flytune.tune.entries[1].reference")
    assert e.value.rule.startswith(rule), e.value.rule
    assert not out.exists()  # nothing was tuned


def test_a_plan_files_reference_is_named_in_the_plan_and_the_cli_exits_2(tmp_path):
    proj = project(tmp_path / "p", entry("off", 'reference = "refpkg.reference:nope"'), plan=True)
    out = tmp_path / "out"
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"flytune: error: {proj / 'plan.toml'}: Field `entries[0].reference` names "
                                f"'refpkg.reference:nope', but module refpkg.reference has no nope"), r.stderr
    assert "Traceback" not in r.stderr and not out.exists() and r.stdout == ""


def test_a_reference_on_an_entry_that_checks_nothing_is_refused(tmp_path):
    from flytune_build import tuning

    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:add"\ncheck = false'))
    with pytest.raises(PlanError, match="entries\\[0\\].reference") as e:
        tuning.tune(proj, output=tmp_path / "out", allow_ci=True, ranking="synthetic")
    assert e.value.rule.startswith("names a reference function, but the entry says check = false"), e.value.rule


KEPT_WRONG = Config({"BLOCK": 32}, num_warps=1)   # refpkg.kept_kernel adds 1 at BLOCK=32


def kept_entry(extra: str = "") -> str:
    return entry("kept", 'autotuner = "refpkg:kept_kernel"' + (f"\n{extra}" if extra else ""))


def test_unchecked_triton_s_own_search_would_ship_the_wrong_config(tmp_path):
    """What the checks below guard against: with `check = false`, Triton's search of the kept kernel
    picks BLOCK=32, the fastest-ranked config and the one that adds 1."""
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", kept_entry("check = false")), out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 0, r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept"]
    assert art.config == KEPT_WRONG, art.provenance["candidates"]
    assert art.provenance["outputs"] == {"note": "not checked: the plan entry says check = false"}
    assert art.provenance["selection"]["default"]["outcome"] == "replaced"   # BLOCK=16, Triton's first config


def test_a_re_tune_of_a_kept_kernel_keeps_the_shipped_winner_within_the_margin(tmp_path):
    """flytune's selection, not Triton's plain minimum, picks a kept kernel's winner: the output's
    winner (BLOCK=64, ranked 1.8% behind BLOCK=32) stays, where Triton alone would pick BLOCK=32."""
    out = tmp_path / "out"
    proj = project(tmp_path / "p", kept_entry("check = false"))
    assert tune(proj, out, tmp_path, "--ranking", "synthetic").returncode == 0
    first = artifacts(out)["refpkg.kept"]
    assert first.config == KEPT_WRONG
    Artifact(first.kernel, first.key, first.device, Config({"BLOCK": 64}, num_warps=1), first.provenance).save(out)
    r = tune(proj, out, tmp_path, "--ranking", "synthetic", "--no-resume")
    assert r.returncode == 0, r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept"]
    assert art.config == Config({"BLOCK": 64}, num_warps=1), r.stdout
    assert "kept (+1.8%)" in r.stdout, r.stdout   # the output's file is left as it was


@pytest.mark.parametrize("ranking", ["synthetic", "measured"])
@pytest.mark.parametrize("reference", [None, "refpkg.reference:add"])
def test_triton_s_own_search_of_a_kept_kernel_checks_every_candidate(tmp_path, ranking, reference):
    """An `autotuner` entry (a kept `@triton.autotune` kernel, searched by Triton itself) is checked as
    a flytune kernel is: against the reference function, else the first declared config; the config
    that differs is never timed, cannot win, and carries its error."""
    out = tmp_path / "out"
    extra = f'reference = "{reference}"' if reference else ""
    r = tune(project(tmp_path / "p", kept_entry(extra)), out, tmp_path, "--ranking", ranking)
    assert r.returncode == 0, r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept"]
    assert art.config != KEPT_WRONG, art.provenance["candidates"]
    against = {"function": reference} if reference else {"reference": Config({"BLOCK": 16}, num_warps=1).to_json()}
    assert art.provenance["outputs"] == {**against, "rtol": None, "atol": None, "rejected": 1}
    wrong = candidate(art, KEPT_WRONG)
    assert wrong["time_ms"] is None and wrong["error"].startswith("WrongOutput: `out` differs from the reference "), wrong
    assert "first at [0]: 2 vs 1" in wrong["error"], wrong
    assert all(c["time_ms"] is not None for c in art.provenance["candidates"] if c is not wrong)
    n = len(art.provenance["candidates"])   # and said where the run ends, not only in the artifact
    assert f"refused: refpkg.kept n=100: 1 of {n} candidates gave a wrong output in this search" in r.stdout, r.stdout


def test_a_kept_kernel_whose_every_candidate_differs_from_the_reference_ships_nothing(tmp_path):
    (tmp_path / "p").mkdir()
    proj = project(tmp_path / "p", kept_entry('reference = "refpkg.reference:minus"'))
    with open(proj / "refpkg" / "reference.py", "a") as f:
        f.write("\ndef minus(x, y, out, n):\n    out.copy_(x - y)\n")
    out = tmp_path / "out"
    r = tune(proj, out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "SearchError: Field `configs` every candidate failed: Config(BLOCK=16, " in r.stdout, r.stdout
    assert "WrongOutput: `out` differs from the reference function refpkg.reference:minus's" in r.stdout, r.stdout
    assert not list(out.glob("*.json")) if out.exists() else True
    assert "Traceback" not in r.stderr


def test_the_provenance_names_the_reference_function_or_config_never_both():
    from flytune_build.core.choice import check_outputs

    f = codec.Fields("a.json", ArtifactError)
    record = {"function": "mylib.ref:add", "rtol": None, "atol": 0.5, "rejected": 1}
    assert check_outputs(record, f) == record
    with pytest.raises(ArtifactError, match="provenance.outputs.function` must be `module:function`"):
        check_outputs({"function": "mylib ref"}, f)
    with pytest.raises(ArtifactError, match="must not be given with `reference`"):
        check_outputs({"function": "mylib.ref:add", "reference": Config({"BLOCK": 16}).to_json()}, f)


def test_harvest_and_the_plan_read_module_function_by_one_rule():
    from flytune_build.core.codec import FUNCTION
    from flytune_build.core.project import REFERENCE
    from flytune_build.tuning.harvest import harvest

    assert REFERENCE.pattern == FUNCTION.pattern
    for bad in ("mylib", "mylib:", "my-lib:f", "mylib:f.g", "1lib:f"):
        assert not FUNCTION.fullmatch(bad)
        with pytest.raises(UsageError, match="the compile entry must be `module:function`"):
            harvest(bad)
    assert FUNCTION.fullmatch("my_lib.models:block")
    assert json.loads(json.dumps(REFERENCE.schema()))["pattern"] == f"^(?:{FUNCTION.pattern})$"


def test_a_reference_that_returns_its_result_instead_of_writing_it_is_told_so(tmp_path):
    """A common slip: `return x + y` where the kernel writes `out`: the job fails, saying so, instead of
    rejecting every candidate against the untouched output."""
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:returns"'))
    with open(proj / "refpkg" / "reference.py", "a") as f:
        f.write("\ndef returns(x, y, out, n):\n    return x + y\n")
    r = tune(proj, tmp_path / "out", tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stdout
    assert ("TuneError: the reference function refpkg.reference:returns returned a Tensor and wrote nothing into "
            "the call's tensors") in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def results_entry(name: str, kernel: str, extra: str = "") -> str:
    return (f'kernel = "refpkg.{name}"\nsetup = "refpkg:kept_{name}_result"\nshapes = [{{ n = 100 }}]\n'
            f'autotuner = "refpkg:{kernel}"' + (f"\n{extra}" if extra else ""))


@pytest.mark.parametrize("ranking", ["synthetic", "measured"])
def test_a_checked_kept_kernel_leaves_the_callers_tensors_holding_the_winners_outputs(tmp_path, ranking):
    """The check restores the call's tensors as found around every launch; the winner then runs on them
    once, as Triton's run launches its pick: a plain output, an in-place `x += y` (restore_value) and an
    atomic sum (reset_to_zero) hold their results after the tuned call (the setup asserts it), checked or
    not. The pruned kernel's reference is the first config its early_config_prune makes, with its pre_hook."""
    out = tmp_path / "out"
    entries = [results_entry(k, f"kept_{k}_kernel") for k in ("inplace", "sum", "pruned")]
    entries += [results_entry("add", "kept_kernel"), results_entry("sum", "kept_sum_kernel", "check = false")
                .replace('kernel = "refpkg.sum"', 'kernel = "refpkg.unchecked"')]
    r = tune(project(tmp_path / "p", *entries), out, tmp_path, "--ranking", ranking)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    arts = artifacts(out)
    assert set(arts) == {"refpkg.add", "refpkg.inplace", "refpkg.sum", "refpkg.pruned", "refpkg.unchecked"}, r.stdout
    assert arts["refpkg.add"].config != KEPT_WRONG
    for name in ("refpkg.inplace", "refpkg.sum"):
        assert arts[name].provenance["outputs"]["rejected"] == 0, arts[name].provenance
    pruned = arts["refpkg.pruned"]
    assert pruned.provenance["outputs"] == {"reference": Config({"BLOCK": 32}, num_warps=1).to_json(), "rtol": None,
                                            "atol": None, "rejected": 0}, pruned.provenance
    assert pruned.config.kwargs["BLOCK"] in (32, 64, 128)


def test_a_reference_function_of_a_kept_kernel_under_heuristics_gets_the_call_s_arguments_only(tmp_path):
    """`autotuner = "module:kernel.fn"` (the Autotuner under @triton.heuristics): what the heuristics add
    to the call's keywords (EVEN) is a meta-parameter, not an argument the reference function takes."""
    out = tmp_path / "out"
    e = entry("kept_heuristic", 'autotuner = "refpkg:kept_heuristic_kernel.fn"\nreference = "refpkg.reference:add"')
    r = tune(project(tmp_path / "p", e), out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept_heuristic"]
    assert art.provenance["outputs"] == {"function": "refpkg.reference:add", "rtol": None, "atol": None,
                                         "rejected": 0}


@pytest.mark.parametrize("check", ["", "\ncheck = false"])
def test_a_kept_config_that_ends_triton_s_search_fails_its_job_naming_the_config(tmp_path, check):
    """Triton's search stops at a config that raises where it is timed (the interpreter's static_assert):
    the job fails with a typed error naming that config, checked or not, and nothing is written."""
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", entry("kept_asserting", 'autotuner = "refpkg:kept_asserting_kernel"' + check)),
             out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert ("failed: refpkg.kept_asserting n=100: SearchError: Field `configs` Config(BLOCK=32, num_warps=1, "
            "num_stages=3, num_ctas=1) failed where Triton timed it, which ends Triton's search: InterpreterError: "
            "AssertionError") in r.stdout, r.stdout
    assert "Traceback" not in r.stderr and not list(out.glob("*.json"))


def test_a_broadcast_input_is_checked_too(tmp_path):
    """An `expand`ed input (its elements share one location) is restored through the memory it views:
    the check runs, and the wrong config is rejected, instead of the search going unchecked."""
    out = tmp_path / "out"
    r = tune(project(tmp_path / "p", entry("kept_bias", 'autotuner = "refpkg:kept_bias_kernel"')), out, tmp_path,
             "--ranking", "synthetic")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept_bias"]
    assert art.provenance["outputs"] == {"reference": Config({"BLOCK": 16}, num_warps=1).to_json(), "rtol": None,
                                         "atol": None, "rejected": 1}, art.provenance["outputs"]
    assert art.config != KEPT_WRONG and candidate(art, KEPT_WRONG)["error"].startswith("WrongOutput: `out` differs")


@pytest.mark.parametrize("reference", [None, "refpkg.reference:add"])
def test_an_input_that_requires_grad_is_checked_too(tmp_path, reference):
    """Restoring a leaf that requires grad is no in-place step of the caller's graph: the check runs (it
    neither goes unchecked with a note nor fails the job with torch's error), the wrong config is rejected."""
    out = tmp_path / "out"
    extra = 'autotuner = "refpkg:kept_kernel"' + (f'\nreference = "{reference}"' if reference else "")
    r = tune(project(tmp_path / "p", entry("kept_grad", extra)), out, tmp_path, "--ranking", "synthetic")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    art = artifacts(out)["refpkg.kept_grad"]
    against = {"function": reference} if reference else {"reference": Config({"BLOCK": 16}, num_warps=1).to_json()}
    assert art.provenance["outputs"] == {**against, "rtol": None, "atol": None, "rejected": 1}, art.provenance["outputs"]
    assert art.config != KEPT_WRONG


def test_a_reference_that_calls_the_kernel_being_tuned_fails_its_job_once_saying_why(tmp_path):
    """The kernel's search would start again inside its own reference (and that one's reference...):
    the job fails at once, naming the reference and the kernel, instead of recursing."""
    proj = project(tmp_path / "p", entry("add", 'reference = "refpkg.reference:calls"'))
    with open(proj / "refpkg" / "reference.py", "a") as f:
        f.write("\nimport triton\n\ndef calls(x, y, out, n):\n    import refpkg\n"
                "    refpkg.add_kernel[lambda m: (triton.cdiv(n, m['BLOCK']),)](x, y, out, n)\n")
    r = tune(proj, tmp_path / "out", tmp_path, "--ranking", "synthetic")
    assert r.returncode == 1, r.stdout
    assert ("ReferenceSearchError: the reference function refpkg.reference:calls calls a tuned kernel (refpkg.add) "
            "whose key is not decided yet") in r.stderr, r.stderr
    assert r.stderr.count("refpkg.reference:calls") == 1 and "Traceback" not in r.stderr
