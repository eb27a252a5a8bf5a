"""The output check reaches every tensor a kernel writes through, and never passes a config silently:
outputs in a tuple argument or behind a tensor descriptor are compared and put back; a store past an
output view into the rest of its buffer is refused and undone; a config whose checked launch failed is
never timed as if it had passed; a failure of the comparison itself leaves the search unchecked, saying
so; a config Triton's own timing skips says why (runtime.searching.outputs, runtime.adapters.triton_search)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from buildkit import tune_pyproject
from conftest import python_env

from flytune_build.core.config import Config
from flytune_build.runtime.searching import outputs

KERNELS = '''
import torch, triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor
import flytune_build as ft
from flytune_build import Config
from flytune_build.triton import adopt

CONFIGS = [Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]

# BLOCK=64 is wrong in each kernel below; a synthetic ranking puts it first, so only the check refuses it

@ft.autotune(CONFIGS, ["x", "n"], name="reachpkg.tuple")
@triton.jit
def tuple_kernel(x, outs, n, BLOCK: tl.constexpr):   # the output travels in a tuple (Triton 3.x tuple arguments)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < (n - 1 if BLOCK == 64 else n)
    tl.store(outs[0] + offs, tl.load(x + offs, mask=m) + 1.0, mask=m)

def set_block(nargs):
    nargs["out_desc"].block_shape = [nargs["BLOCK"]]

@ft.autotune([triton.Config({"BLOCK": b}, num_warps=1, pre_hook=set_block) for b in (16, 32, 64)], ["x", "n"],
             name="reachpkg.desc")
@triton.jit
def desc_kernel(x, out_desc, n, BLOCK: tl.constexpr):   # the output written through a host tensor descriptor
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    out_desc.store([tl.program_id(0) * BLOCK], tl.load(x + offs, mask=offs < n) + (2.0 if BLOCK == 64 else 1.0))

@ft.autotune(CONFIGS, ["x", "n"], name="reachpkg.past")
@triton.jit
def past_kernel(x, out, n, BLOCK: tl.constexpr):   # BLOCK=64 forgets the store's mask: it writes past `out`
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0) + 1.0
    if BLOCK == 64:
        tl.store(out + offs, v)
    else:
        tl.store(out + offs, v, mask=offs < n)

def too_big(nargs):
    raise OutOfResources(232448, 101376, "shared memory")

@triton.autotune([triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1),
                  triton.Config({"BLOCK": 64}, num_warps=1, pre_hook=too_big)], key=["n"])
@triton.jit
def kept_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

adopt(kept_kernel, name="reachpkg.kept")

BUFFERS = []   # each call's whole buffer, so the test reads what the tune left in it

def tupled(n):
    x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), -1.0)
    return lambda: tuple_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, (out,), n)

def described(n):
    x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), -1.0)
    return lambda: desc_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, TensorDescriptor(out, [n], [1], [16]), n)

def sliced(n):
    buf = torch.full((n + 28,), 7.0)   # a slice of a larger buffer: its tail belongs to someone else
    x, out = torch.arange(n, dtype=torch.float32), buf[:n]
    def call():
        past_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
        BUFFERS.append(buf[n:].tolist())
    return call

def kept(n):
    x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), -1.0)
    return lambda: kept_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
'''

FLAKY = '''
import torch, triton
import triton.language as tl
import flytune_build as ft

CALLS = {"n": 0}
def flaky(nargs):   # fails on its first call only: a workspace allocation under memory pressure
    CALLS["n"] += 1
    if CALLS["n"] == 1:
        raise RuntimeError("out of memory (transient)")

LAST = [None]
def do_bench(fn, quantiles=None):   # the kernel's own timer, deterministic: BLOCK=64 is the fastest
    fn()
    t = {16: 3.0, 32: 2.0, 64: 1.0}[LAST[0]]
    return [t] * 3 if quantiles else t

@ft.autotune([triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1),
              triton.Config({"BLOCK": 64}, num_warps=1, pre_hook=flaky)], ["x", "n"], name="flakypkg.add",
             do_bench=do_bench)
@triton.jit
def add_kernel(x, out, n, BLOCK: tl.constexpr):   # BLOCK=64 is wrong: the last element is never written
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < (n - 1 if BLOCK == 64 else n)
    tl.store(out + offs, tl.load(x + offs, mask=m) + 1.0, mask=m)

def add(n):
    x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), -1.0)
    def grid(meta):
        LAST[0] = meta["BLOCK"]
        return (triton.cdiv(n, meta["BLOCK"]),)
    return lambda: add_kernel[grid](x, out, n)
'''


def project(root: Path, pkg: str, source: str, entries: str) -> Path:
    (root / pkg).mkdir(parents=True)
    (root / pkg / "__init__.py").write_text(source)
    (root / "pyproject.toml").write_text(tune_pyproject(pkg, f"entries = [{entries}]"))
    return root


def tune(proj: Path, tmp_path: Path, ranking: str) -> dict:
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache", PYTHONPATH=proj)
    env.pop("FLYTUNE_RANKING", None)
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(proj), "--allow-ci",
                        "--no-progress", "--ranking", ranking, "--output", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")]
    return {d["kernel"]: d for d in docs} | {"stdout": r.stdout}


def errors(doc: dict) -> dict:
    return {c["config"]["kwargs"]["BLOCK"]: c.get("error") for c in doc["provenance"]["candidates"]}


@pytest.fixture(scope="module")
def reached(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reach")
    entries = ", ".join(f'{{ kernel = "reachpkg.{k}", setup = "reachpkg:{s}", shapes = [{{ n = 100 }}]{extra} }}'
                        for k, s, extra in (("tuple", "tupled", ""), ("desc", "described", ""), ("past", "sliced", ""),
                                            ("kept", "kept", ', autotuner = "reachpkg:kept_kernel"')))
    return tune(project(tmp / "p", "reachpkg", KERNELS, entries), tmp, "synthetic")


def test_an_output_in_a_tuple_argument_is_compared_and_the_wrong_config_refused(reached):
    doc = reached["reachpkg.tuple"]
    assert doc["config"]["kwargs"]["BLOCK"] != 64 and doc["provenance"]["outputs"]["rejected"] == 1
    assert errors(doc)[64].startswith("WrongOutput: `outs[0]` differs from the reference")


def test_an_output_written_through_a_tensor_descriptor_is_compared(reached):
    doc = reached["reachpkg.desc"]
    assert doc["config"]["kwargs"]["BLOCK"] != 64 and doc["provenance"]["outputs"]["rejected"] == 1
    assert errors(doc)[64].startswith("WrongOutput: `out_desc.base` differs from the reference")


def test_a_store_past_the_output_view_is_refused_naming_it(reached):
    doc = reached["reachpkg.past"]
    assert doc["config"]["kwargs"]["BLOCK"] != 64 and doc["provenance"]["outputs"]["rejected"] == 1
    assert errors(doc)[64].startswith("WrongOutput: `out`: ") and "after its view changed" in errors(doc)[64]


def test_a_config_triton_skips_as_out_of_resources_says_why(reached):
    doc = reached["reachpkg.kept"]
    assert doc["config"]["kwargs"]["BLOCK"] != 64
    assert errors(doc)[64].startswith("OutOfResources: "), errors(doc)
    assert "skipped: reachpkg.kept n=100: 1 of 3 candidates failed where they ran" in reached["stdout"]   # the table says so
    assert "refused: reachpkg.past n=100: 1 of 3 candidates gave a wrong output" in reached["stdout"]


def test_a_store_past_the_view_is_undone_the_callers_buffer_as_found():
    import torch

    buf = torch.full((8,), 7.0)
    out = buf[:4]
    check = outputs.Check({"out": out}, lambda cfg: _write(buf, cfg), outputs.Policy())
    check.find_reference([Config({"B": 1})])
    with pytest.raises(outputs.WrongOutput, match=r"`out`: a store outside the tensor: its storage after its view changed "
                       r"\(bytes 2-2 of the 16 watched there\)"):   # 7.0 made 5.0: one byte of the float
        check(Config({"B": 2}))
    check.restore()
    assert buf.tolist() == [7.0] * 8


def _write(buf, cfg):
    buf[:4] = 1.0
    if cfg.kwargs["B"] == 2:
        buf[4] = 5.0   # past the view


def test_a_config_whose_checked_launch_failed_is_never_timed_and_says_why(tmp_path):
    proj = project(tmp_path / "p", "flakypkg", FLAKY,
                   '{ kernel = "flakypkg.add", setup = "flakypkg:add", shapes = [{ n = 100 }] }')
    doc = tune(proj, tmp_path, "measured")["flakypkg.add"]
    assert doc["config"]["kwargs"]["BLOCK"] == 32   # the fastest config whose outputs were checked
    assert errors(doc)[64] == "RuntimeError: out of memory (transient)"


def test_a_comparison_that_fails_leaves_the_search_unchecked_and_says_so(monkeypatch):
    import torch

    out = torch.zeros(4)
    check = outputs.Check({"out": out}, lambda cfg: out.fill_(cfg.kwargs["B"]), outputs.Policy())
    check.find_reference([Config({"B": 1})])

    def no_memory(*args):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(outputs, "differs", no_memory)
    assert check.screen([Config({"B": 1}), Config({"B": 2}), Config({"B": 3})]) == {}   # none failed for it
    note = check.record([])["note"]
    assert note.startswith("not checked from Config(B=2") and "RuntimeError: out of memory" in note
    named = outputs.Check({"out": out}, lambda cfg: out.fill_(1), outputs.Policy(reference=lambda *a: None,
                                                                                 reference_name="m:f"))
    named.expected = {"out": out.clone()}
    with pytest.raises(outputs.ReferenceUnchecked, match="m:f"):   # the plan asked for this check: never unchecked
        named(Config({"B": 2}))


def test_complex_outputs_take_their_parts_tolerance():
    import torch

    assert outputs.tolerance(torch.complex64, outputs.Policy()) == outputs.TOLERANCES["float32"]
    assert outputs.tolerance(torch.complex128, outputs.Policy()) == outputs.TOLERANCES["float64"]
    z = torch.ones(4, dtype=torch.complex64)
    assert "4 of 4 elements" in outputs.differs(z * 1.1, z, outputs.Policy())


def test_a_search_whose_outputs_were_not_checked_says_so_in_the_tune_summary(tmp_path):
    proj = project(tmp_path / "p", "flakypkg", FLAKY,
                   '{ kernel = "flakypkg.add", setup = "flakypkg:add", shapes = [{ n = 100 }], check = false }')
    got = tune(proj, tmp_path, "synthetic")
    assert "unchecked: flakypkg.add n=100: not checked: the plan entry says check = false" in got["stdout"]


def test_a_store_between_a_column_slices_rows_is_refused_and_undone():
    """An output that is a column slice of a wider buffer (one head of a fused QKV): a config that writes the
    columns beside it (a missing N mask) writes between the slice's rows, inside the bytes it spans."""
    import torch

    parent = torch.zeros(8, 64)
    out = parent[:, :16]

    def launch(cfg):
        out.fill_(1.0)
        if cfg.kwargs["B"] == 2:
            parent[:7, 16:32] = 1.0   # the next columns, never past the slice's last row
    check = outputs.Check({"out": out}, launch, outputs.Policy())
    check.find_reference([Config({"B": 1})])
    with pytest.raises(outputs.WrongOutput, match="`out`: a store outside the tensor: its storage between its "
                                                  "elements changed"):
        check(Config({"B": 2}))
    check.restore()
    assert float(parent[:, 16:].abs().sum()) == 0.0 and float(out.sum()) == 0.0   # as found


def test_verify_warns_once_per_kernel_of_winners_chosen_unchecked_but_not_where_the_plan_said_so():
    from flytune_build.core import verification
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.device import INTERPRETER

    def art(n, note):
        return Artifact("reachpkg.big", {"n": n}, INTERPRETER, Config({"BLOCK": 16}, num_warps=1),
                        {"outputs": {"note": note}})
    too_big = "not checked: the call's tensors take 3.0 GiB, over 2 GiB"
    found = verification.check([art(1, too_big), art(2, too_big), art(3, verification.DELIBERATE)], lambda a: a.filename)
    (said,) = [w for w in found.warnings if "provenance.outputs.note" in w]
    assert "3.0 GiB" in said and "(and 1 more of its artifacts)" in said and not found.errors
