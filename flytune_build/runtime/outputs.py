"""Checked outputs: during a tuning search (`flytune tune`: inside a `session` whose `check` is a `Policy`), each candidate's outputs
are compared with a reference's, computed on the same inputs, so that a fast config that computes the
wrong thing never wins. A search a process runs on its own (FLYTUNE_AUTOTUNE=1, a first call with no
other tier) launches and calls hooks exactly as Triton's Autotuner would, unchecked.

Invariants (pinned by tests/test_selection.py and tests/test_reference.py):
- the reference is the plan entry's reference function where it names one (`reference = "module:function"`),
  else the kernel's `default` config for the call, else the first candidate in declared order; where a
  config fails to launch, the next candidate that launches;
- a reference function is called as the kernel is (`fn(*args, **kwargs)`, the arguments the call passed,
  without grid or config), on the call's tensors as found, and writes its outputs into them in place; what
  it returns is ignored. Where it raises, or returns a value having written nothing into the call's
  tensors (a function that returns its result instead of writing it), the search fails (`TuneError`
  naming it): a plan that names a reference never ships a winner that was not checked against it;
- every candidate (and the reference) launches on the caller's tensors as the search found them:
  each tensor argument is restored from a copy taken before the first launch (a broadcast, `expand`ed
  one through the memory it views), so a config that leaves
  part of an output unwritten leaves the found bytes there, not another candidate's result;
- every tensor argument is compared after the launch: integer and bool tensors exactly, floating ones
  within the tolerance of their dtype (`TOLERANCES`) or the plan entry's `rtol`/`atol`; NaN equals NaN;
- a candidate that differs raises `WrongOutput` where it is timed: it times as infinity, can never win,
  and `provenance.candidates[i].error` says where it differed; `provenance.outputs` records the
  reference config (or, as `function`, the reference function's name) and the tolerances (or, in
  `note`, why nothing was checked);
- the caller's tensors are as the search found them once the check pass ends.

Outputs are not checked when the plan entry says `check = false`, when no tensor is passed, or when
the tensors passed exceed MAX_BYTES (the two copies the check holds would double them) or cannot be
copied; where the plan entry names a reference function, each of the last three fails the search
(`TuneError`) instead.
"""
from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.config import Config
from ..core.errors import TuneError, foreign_failure, one_line
from . import session

# (rtol, atol) by dtype name; a dtype not listed and not floating compares exactly
TOLERANCES = {"float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3),
              "bfloat16": (1.6e-2, 1e-2)}
LOW_PRECISION = (1.25e-1, 1.25e-1)   # the float8 kinds and any other narrow float
MAX_BYTES = 2 << 30                  # tensor bytes a call may pass and still be checked


class WrongOutput(Exception):
    """A candidate's outputs differ from the reference's on the same inputs."""


class ReferenceSearchError(TuneError):
    """A reference function started a search of a tuned kernel: it would check a kernel against itself."""


@dataclass(frozen=True)
class Policy:
    check: bool = True
    rtol: float | None = None     # None: by dtype
    atol: float | None = None
    reference: Callable | None = None   # the plan entry's reference function (None: a config is the reference)
    reference_name: str | None = None   # its `module:function`, as the plan names it


def policy() -> Policy | None:
    """The current tuning session's policy; None outside every one that sets it (no check)."""
    return session.current().check


def tolerance(dtype: Any, p: Policy) -> tuple[float, float]:
    """(rtol, atol) for a floating tensor of `dtype` under `p`."""
    name = str(dtype).rpartition(".")[2]
    rtol, atol = TOLERANCES.get(name, LOW_PRECISION)
    return (rtol if p.rtol is None else p.rtol), (atol if p.atol is None else p.atol)


class Check:
    """One search's output check: the inputs as found, and the reference's outputs."""

    def __init__(self, tensors: dict[str, Any], launch: Callable[[Config], None], p: Policy):
        self.tensors, self.launch, self.policy = tensors, launch, p
        self.memory = {n: _memory(t) for n, t in tensors.items()}   # what each restore writes
        self.found = {n: t.detach().clone() for n, t in self.memory.items()}
        self.reference: Config | None = None   # the reference config, where no function is the reference
        self.expected: dict[str, Any] | None = None   # None: nothing to compare with
        self.note: str | None = None
        self.rejected: list[Config] = []

    @property
    def against(self) -> str:
        """The reference, as an error names it."""
        if self.policy.reference is not None:
            return f"function {self.policy.reference_name}"
        return str(self.reference)

    def restore(self) -> None:
        """Every tensor argument as the search found it (a tensor that requires grad too: a copy back
        is no step of the caller's graph)."""
        import torch

        with torch.no_grad():
            for n, t in self.memory.items():
                t.copy_(self.found[n])

    def find_reference(self, order: Sequence[Config]) -> None:
        errors = []
        for cfg in dict.fromkeys(order):
            self.restore()
            try:
                self.launch(cfg)
            except Exception as e:  # noqa: BLE001 - the next config is the reference; this one's search fails it
                errors.append(f"{cfg}: {type(e).__name__}: {e}"[:300])
                continue
            self.reference = cfg
            self.expected = {n: t.detach().clone() for n, t in self.tensors.items()}
            return
        self.note = "not checked: no config launched for the reference (" + "; ".join(errors)[:400] + ")"

    def call_reference(self, args: tuple, kwargs: dict) -> None:
        """The reference function's outputs: it is called as the kernel was, on the inputs as found. A
        TuneError where it raises: no candidate can be checked, and the plan asked for this check."""
        import torch

        self.restore()
        token = _in_reference.set((*_in_reference.get(), self.policy.reference_name))
        try:
            with torch.no_grad():   # as a kernel's launch: what it writes joins no graph of the caller's tensors
                result = self.policy.reference(*args, **kwargs)
        except BaseException as e:
            self.restore()
            if not foreign_failure(e) or isinstance(e, ReferenceSearchError):
                raise
            raise TuneError(f"the reference function {self.policy.reference_name} raised on the call's inputs, "
                            f"so no candidate can be checked against it: {one_line(e)}") from None
        finally:
            _in_reference.reset(token)
        if result is not None and all(_same(t, self.found[n]) for n, t in self.memory.items()):
            raise TuneError(f"the reference function {self.policy.reference_name} returned a {type(result).__name__} "
                            f"and wrote nothing into the call's tensors: what it returns is ignored, so it must "
                            f"write its results into the output tensors in place, as the kernel does")
        self.expected = {n: t.detach().clone() for n, t in self.tensors.items()}

    def __call__(self, cfg: Config) -> None:
        """Launch `cfg` on the inputs as found and raise `WrongOutput` unless its outputs are the reference's."""
        if self.expected is None or cfg == self.reference:  # the reference config's outputs are the expected
            if self.expected is None:
                self.launch(cfg)
            return
        self.restore()
        self.launch(cfg)
        for n, t in self.tensors.items():
            why = differs(t, self.expected[n], self.policy)
            if why is not None:
                self.rejected.append(cfg)
                raise WrongOutput(f"`{n}` differs from the reference {self.against}'s: {why}")

    def screen(self, configs: Sequence[Config]) -> dict[Config, str]:
        """Each config checked once: {config: why} of those whose outputs differ (a config that fails to
        launch is left to the timing, which records its own error). The inputs are restored after."""
        wrong = {}
        try:
            for cfg in configs:
                try:
                    self(cfg)
                except WrongOutput as e:
                    wrong[cfg] = str(e)
                except Exception:  # noqa: BLE001 - timing fails it with its own error
                    pass
        finally:
            self.restore()
        return wrong

    def record(self, candidates: Sequence[Any]) -> dict:
        """`provenance.outputs`."""
        if self.expected is None:
            return {"note": (self.note or "not checked")[:500]}
        against = {"function": self.policy.reference_name} if self.reference is None else \
            {"reference": self.reference.to_json()}
        return {**against, "rtol": self.policy.rtol, "atol": self.policy.atol,
                "rejected": sum(1 for c in candidates if c.config in self.rejected)}


# the reference functions this context is calling (a search may not start inside one); per context, so
# another thread's reference never refuses this thread's search
_in_reference: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("flytune_in_reference", default=())


def start(kernel, site, configs: Sequence[Config], launch: Callable[[Config], None]) -> tuple[Check | None, dict | None]:
    """The check for this search (None when none is made) and, when none is, `provenance.outputs` saying
    why. `site`: the call as placed (`placement.Site`: its args, kwargs and bound parameters)."""
    p = policy()
    if p is None:
        return None, None
    inside = _in_reference.get()
    if inside:  # the reference started a search of a tuned kernel: it would check a kernel against itself
        raise ReferenceSearchError(f"the reference function {inside[-1]} calls a tuned kernel "
                        f"({getattr(kernel, 'name', None) or 'a @triton.autotune kernel'}) whose key is not decided "
                        f"yet, so its search would start inside the reference: a reference must compute without the "
                        f"kernels being tuned (plain torch, or a kernel launched with a fixed config)")
    if not p.check:
        return None, {"note": "not checked: the plan entry says check = false"}
    bound = site.bound
    tensors = {n: v for n, v in bound.items() if _is_tensor(v)}
    why = None
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if not tensors:
        why = "the call passes no tensor"
    elif size > MAX_BYTES:
        why = f"the call's tensors take {size / 2**30:.1f} GiB, over {MAX_BYTES / 2**30:.0f} GiB"
    else:
        try:
            check = Check(tensors, launch, p)
            if p.reference is None:
                check.find_reference(_reference_order(kernel, bound, configs))
        except Exception as e:  # noqa: BLE001 - no memory for the copies: the search goes on unchecked, and says so
            why = f"{type(e).__name__}: {e}"[:480]
    if why is not None:
        if p.reference is not None:  # the plan named a function to check against: never a winner unchecked
            raise TuneError(f"the outputs cannot be checked against the reference function {p.reference_name}: "
                            f"{why}")
        return None, {"note": f"not checked: {why}"}
    if p.reference is not None:
        check.call_reference(site.args, site.kwargs)
    return check, None


def _reference_order(kernel, bound: dict, configs: Sequence[Config]) -> list[Config]:
    """The kernel's default config for this call first (where it has one), then the candidates in declared order."""
    first: list[Config] = []
    default = getattr(kernel, "default", None)
    if default is not None:
        try:
            first = [Config.coerce(default(bound))]
        except Exception:  # noqa: BLE001 - a heuristic that fails here: the first candidate is the reference
            first = []
    return first + list(configs)


def _memory(t):
    """`t` with each broadcast (stride-0) dimension narrowed to its one element: the memory it views, which
    can be written in place (an `expand`ed input cannot: its elements share one location)."""
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            t = t.narrow(d, 0, 1)
    return t


def _same(a, b) -> bool:
    """Whether two tensors hold the same bytes (NaN equal to NaN)."""
    import torch

    return bool(torch.equal(a, b)) or (a.dtype.is_floating_point and bool(torch.isclose(a, b, 0, 0, True).all()))


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "dtype") and hasattr(v, "copy_") and hasattr(v, "clone") and hasattr(v, "numel")


def differs(got, want, p: Policy) -> str | None:
    """Where `got` differs from `want` beyond `p`'s tolerance (None: it does not)."""
    import torch

    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, not {tuple(want.shape)}"
    if got.dtype.is_floating_point or got.dtype.is_complex:
        rtol, atol = tolerance(got.dtype, p)
        wide = (torch.float32, torch.float64, torch.complex64, torch.complex128)
        g, w = (got, want) if got.dtype in wide else (got.float(), want.float())
        close = torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        limits = f" (rtol {rtol:g}, atol {atol:g})"
    else:
        g, w, close, limits = got, want, got == want, " (exactly)"
    if bool(close.all()):
        return None
    bad = ~close
    where = [int(i) for i in bad.nonzero()[0]]
    at = tuple(where)
    return (f"{int(bad.sum())} of {got.numel()} elements{limits}; first at {where}: "
            f"{_item(g[at])} vs {_item(w[at])}")


def _item(v) -> str:
    x = v.item()
    return f"{x:.6g}" if isinstance(x, float) and math.isfinite(x) else repr(x)
