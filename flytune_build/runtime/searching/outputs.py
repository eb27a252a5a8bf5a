"""Checked outputs: during a tuning search (`flytune tune`: inside a `session` whose `check` is a `Policy`), each candidate's outputs
are compared with a reference's, computed on the same inputs, so that a fast config that computes the
wrong thing never wins. A search a process runs on its own (FLYTUNE_AUTOTUNE=1, a first call with no
other tier) launches and calls hooks exactly as Triton's Autotuner would, unchecked.

Invariants (pinned by tests/test_selection.py and tests/test_reference.py):
- the reference is the plan entry's reference function where it names one (`reference = "module:function"`),
  else the kernel's `default` config for the call, else the first candidate in declared order; where a
  config fails to launch, the next candidate that launches; the function and the entry's tolerances are
  for the entry's kernel (`Policy.kernel`): another kernel its setup searches is checked against a config;
- a reference function is called as the kernel is (`fn(*args, **kwargs)`, the arguments the call passed,
  without grid or config), on the call's tensors as found, and writes its outputs into them in place; what
  it returns is ignored. Where it raises, or returns a value having written nothing into the call's
  tensors (a function that returns its result instead of writing it), the search fails (`TuneError`
  naming it): a plan that names a reference never ships a winner that was not checked against it;
- every candidate (and the reference) launches on the caller's tensors as the search found them:
  each tensor argument is restored from a copy taken before the first launch (a broadcast, `expand`ed
  one through the memory it views; one whose elements overlap otherwise through the bytes it spans), so
  a config that leaves part of an output unwritten leaves the found bytes there, not another candidate's
  result;
- the check never changes what autograd sees: it copies, restores and compares through `.data` (and a
  reference function gets the call's tensors so), never bumping a version counter nor adding a step to a
  graph, so a kernel launched on tensors that require grad, on their views (made in no_grad mode too),
  or inside `torch.autograd.Function.forward`/`backward` on tensors saved for backward, is checked as
  any other, and its caller's backward runs as it would unchecked;
- every tensor the call passes is compared after the launch (a tuple argument's items and a tensor
  descriptor's base too: `placement.members`): integer and bool tensors exactly, floating ones within the
  tolerance of their dtype (`TOLERANCES`; a complex one, its parts') or the plan entry's `rtol`/`atol`;
  NaN equals NaN; and the bytes `guards.around` watches (around each tensor, and between a column slice's
  rows, that no argument spans) must be as found: a store past a view (a missing mask) is a wrong output,
  and is undone;
- a config whose launch fails where the check launches it is never timed (its error is its candidate's);
  where the comparison itself fails (no memory for its copies), that config and every later one go
  unchecked and `provenance.outputs.note` says from which, or, under a reference function, the search
  fails (`ReferenceUnchecked`);
- a candidate that differs raises `WrongOutput` where it is timed: it times as infinity, can never win,
  and `provenance.candidates[i].error` says where it differed; `provenance.outputs` records the
  reference config (or, as `function`, the reference function's name) and the tolerances (or, in
  `note`, why nothing was checked);
- the caller's tensors are as the search found them once the check pass ends.

Outputs are not checked when the plan entry says `check = false`, when no tensor is passed, or when
the tensors passed exceed MAX_BYTES (the two copies the check holds would double them), cannot be
copied or put back as found; where the plan entry names a reference function, each of the last three
fails the search (`TuneError`) instead. A check never makes a kernel untunable: where it cannot be made,
the job is tuned unchecked and `provenance.outputs.note` says why; a tensor whose values cannot be
compared is left out of the comparison (the others are compared) and the note names it.
"""
from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.config import Config
from ...core.errors import TuneError, foreign_failure, one_line
from . import guards, session

# (rtol, atol) by dtype name; a dtype not listed and not floating compares exactly
TOLERANCES = {"float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3),
              "bfloat16": (1.6e-2, 1e-2)}
LOW_PRECISION = (1.25e-1, 1.25e-1)   # the float8 kinds and any other narrow float
COMPLEX = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}   # a part's tolerance
MAX_BYTES = 2 << 30                  # tensor bytes a call may pass and still be checked


class WrongOutput(Exception):
    """A candidate's outputs differ from the reference's on the same inputs."""


class Unrestorable(Exception):
    """A tensor the check cannot put back as found: the search goes on unchecked, and says why."""


class ReferenceSearchError(TuneError):
    """A reference function started a search of a tuned kernel: it would check a kernel against itself."""


class ReferenceUnchecked(TuneError):
    """A candidate's outputs could not be compared with the plan's reference function's (the comparison
    itself failed): the plan asked for this check, so the search fails rather than go on unchecked."""


@dataclass(frozen=True)
class Policy:
    check: bool = True
    rtol: float | None = None     # None: by dtype
    atol: float | None = None
    reference: Callable | None = None   # the plan entry's reference function (None: a config is the reference)
    reference_name: str | None = None   # its `module:function`, as the plan names it
    kernel: str | None = None           # the plan entry's kernel, whose searches the function and tolerances are
    #                                     for (None: every search's); another kernel a setup searches (the backward
    #                                     of a forward) is checked against a config, by dtype

    def of(self, kernel) -> Policy:
        """The policy a search of `kernel` is checked under (None: an adopted kernel's, which `recording`
        searches only for its entry)."""
        name = getattr(kernel, "name", None)
        if self.kernel is None or name is None or name == self.kernel:
            return self
        return Policy(self.check)


def policy() -> Policy | None:
    """The current tuning session's policy; None outside every one that sets it (no check)."""
    return session.current().check


def tolerance(dtype: Any, p: Policy) -> tuple[float, float]:
    """(rtol, atol) for a floating tensor of `dtype` under `p`."""
    name = str(dtype).rpartition(".")[2]
    rtol, atol = TOLERANCES.get(COMPLEX.get(name, name), LOW_PRECISION)
    return (rtol if p.rtol is None else p.rtol), (atol if p.atol is None else p.atol)


class Check:
    """One search's output check: the inputs as found, and the reference's outputs.

    It reads and writes the call's tensors only through `.data` (or the bytes they span): the same
    memory, but no step of any autograd graph and no bump of a version counter. A tensor that requires
    grad, a view made in no_grad mode (every view inside `autograd.Function.forward`), a tensor saved
    for backward: the check restores and compares them all without the caller's graph ever seeing it,
    as the kernel's own launch writes raw memory."""

    def __init__(self, tensors: dict[str, Any], launch: Callable[[Config], None], p: Policy):
        self.tensors, self.launch, self.policy = tensors, launch, p
        self.raw = {n: _raw(t) for n, t in tensors.items()}   # what is compared: the memory, outside autograd
        self.memory = {}   # what each restore writes
        self.found = {}
        for n, t in self.raw.items():
            self.memory[n], self.found[n] = _restorable(n, t)
        self.guards = guards.around(self.raw)   # (name, where, bytes, their copy, which of them): never written
        self.reference: Config | None = None   # the reference config, where no function is the reference
        self.expected: dict[str, Any] | None = None   # None: nothing to compare with
        self.note: str | None = None
        self.skipped: dict[str, str] = {}   # tensors that cannot be compared: name -> why (the rest are)
        self.rejected: list[Config] = []
        self.broken: str | None = None      # why the check stopped part-way (its comparison failed): unchecked since

    @property
    def against(self) -> str:
        """The reference, as an error names it."""
        if self.policy.reference is not None:
            return f"function {self.policy.reference_name}"
        return str(self.reference)

    def restore(self) -> None:
        """Every tensor argument as the search found it, through memory autograd does not see."""
        import torch

        with torch.no_grad():
            for n, t in self.memory.items():
                if t is not None:
                    t.copy_(self.found[n])
            for _, _, memory, found, _ in self.guards:
                memory.copy_(found)

    def _expect(self) -> None:
        """The reference's outputs, as the call's tensors now hold them; a tensor whose values cannot be
        compared (its dtype has no comparison here) is left out of the check, and the record says so."""
        self.expected = {}
        for n, t in self.raw.items():
            want = t.clone()
            try:
                differs(want, want, self.policy)
            except Exception as e:  # noqa: BLE001 - compare what can be compared; say what was not
                self.skipped[n] = f"{type(e).__name__}: {e}"[:160]
                continue
            self.expected[n] = want
        if not self.expected:
            self.expected, self.note = None, ("not checked: no tensor can be compared (" + "; ".join(
                f"`{n}`: {why}" for n, why in self.skipped.items()) + ")")[:500]

    def find_reference(self, order: Sequence[Config]) -> None:
        errors = []
        for cfg in dict.fromkeys(order):
            self.restore()
            try:
                self.launch(cfg)
            except Exception as e:  # noqa: BLE001 - the next config is the reference; this one's search fails it
                errors.append(f"{cfg}: {type(e).__name__}: {e}"[:300])
                continue
            outside = self.outside()
            if outside is not None:   # a reference that writes outside the call's tensors checks nothing
                errors.append(f"{cfg}: `{outside[0]}`: {outside[1]}"[:300])
                continue
            self.reference = cfg
            self._expect()
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
                result = self.policy.reference(*_unseen(args), **_unseen(kwargs))
        except BaseException as e:
            self.restore()
            if not foreign_failure(e) or isinstance(e, ReferenceSearchError):
                raise
            raise TuneError(f"the reference function {self.policy.reference_name} raised on the call's inputs, "
                            f"so no candidate can be checked against it: {one_line(e)}") from None
        finally:
            _in_reference.reset(token)
        if result is not None and all(t is None or _same(t, self.found[n]) for n, t in self.memory.items()):
            raise TuneError(f"the reference function {self.policy.reference_name} returned a {type(result).__name__} "
                            f"and wrote nothing into the call's tensors: what it returns is ignored, so it must "
                            f"write its results into the output tensors in place, as the kernel does")
        self._expect()
        if self.expected is None:
            raise TuneError(f"the outputs cannot be checked against the reference function {self.policy.reference_name}: "
                            f"{self.note.removeprefix('not checked: ')}")

    def __call__(self, cfg: Config) -> None:
        """Launch `cfg` on the inputs as found and raise `WrongOutput` unless its outputs are the reference's;
        the launch's own error is the config's. Where the comparison itself fails (no memory for its copies),
        this config and every later one go unchecked (`broken`, which the record says), or, where the plan
        names a reference function, the search fails (`ReferenceUnchecked`): the check never fails a config
        for its own failure, nor passes one silently."""
        if self.expected is None or self.broken is not None or cfg == self.reference:
            if self.expected is None or self.broken is not None:   # (the reference's outputs are the expected)
                self.launch(cfg)
            return
        self.restore()
        self.launch(cfg)
        try:
            why = next(((f"`{n}` differs from the reference {self.against}'s", w) for n, want in self.expected.items()
                        if (w := differs(self.raw[n], want, self.policy)) is not None), None)
            if why is None and (outside := self.outside()) is not None:
                why = f"`{outside[0]}`", outside[1]
        except Exception as e:  # noqa: BLE001 - the comparison's failure, not the config's
            self.broken = f"not checked from {cfg} on: its comparison failed: {type(e).__name__}: {e}"[:480]
            if self.policy.reference is not None:
                raise ReferenceUnchecked(f"the outputs of {cfg} cannot be compared with the reference function "
                                         f"{self.policy.reference_name}'s: {type(e).__name__}: {e}") from None
            return
        if why is not None:
            self.rejected.append(cfg)
            raise WrongOutput(f"{why[0]}: {why[1]}")

    def outside(self) -> tuple[str, str] | None:
        """(label, why) where the last launch wrote into the bytes around the call's tensors (`guards`: a
        store past its view, as a missing mask makes; the caller's memory, which `restore` puts back)."""
        import torch

        for name, where, memory, found, which in self.guards:
            changed = memory != found
            if which is not None:
                changed &= which
            if bool(changed.any()):
                at = changed.nonzero()
                return name, (f"a store outside the tensor: its storage {where} changed (bytes {int(at[0])}-"
                              f"{int(at[-1])} of the {memory.numel()} watched there), as a missing mask writes")
        return None

    def screen(self, configs: Sequence[Config]) -> dict[Config, Exception]:
        """Each config checked once: {config: its error} of those whose outputs differ (`WrongOutput`) or
        whose launch failed here (its own error: a config that failed once is never timed as if it had
        passed). The inputs are restored after."""
        failed = {}
        try:
            for cfg in configs:
                try:
                    self(cfg)
                except ReferenceUnchecked:
                    raise
                except Exception as e:  # noqa: BLE001 - the config's: its candidate carries the error
                    failed[cfg] = e.with_traceback(None)   # (its frames held the check's copies)
        finally:
            self.restore()
        return failed

    def record(self, candidates: Sequence[Any]) -> dict:
        """`provenance.outputs`."""
        if self.expected is None:
            return {"note": (self.note or "not checked")[:500]}
        against = {"function": self.policy.reference_name} if self.reference is None else \
            {"reference": self.reference.to_json()}
        out = {**against, "rtol": self.policy.rtol, "atol": self.policy.atol,
               "rejected": sum(1 for c in candidates if c.config in self.rejected)}
        notes = [self.broken] if self.broken is not None else []
        if self.skipped:  # compared what could be: the rest named, and why
            notes.append("not compared: " + "; ".join(f"`{n}` ({why})" for n, why in self.skipped.items()))
        if notes:
            out["note"] = "; ".join(notes)[:500]
        return out


# the reference functions this context is calling (a search may not start inside one); per context, so
# another thread's reference never refuses this thread's search
_in_reference: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("flytune_in_reference", default=())


def start(kernel, site, configs: Sequence[Config], launch: Callable[[Config], None]) -> tuple[Check | None, dict | None]:
    """The check for this search (None when none is made) and, when none is, `provenance.outputs` saying
    why. `site`: the call as placed (`placement.Site`: its args, kwargs and bound parameters)."""
    p = policy()
    if p is None:
        return None, None
    p = p.of(kernel)
    inside = _in_reference.get()
    if inside:  # the reference started a search of a tuned kernel: it would check a kernel against itself
        raise ReferenceSearchError(f"the reference function {inside[-1]} calls a tuned kernel "
                        f"({getattr(kernel, 'name', None) or 'a @triton.autotune kernel'}) whose key is not decided "
                        f"yet, so its search would start inside the reference: a reference must compute without the "
                        f"kernels being tuned (plain torch, or a kernel launched with a fixed config)")
    if not p.check:
        return None, {"note": "not checked: the plan entry says check = false"}
    bound = site.bound
    tensors = _tensors(bound)
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
            why = (str(e) if isinstance(e, Unrestorable) else f"{type(e).__name__}: {e}")[:480]
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


def _raw(t):
    """`t`'s memory as autograd never sees it (`.data`: the same storage, offset, sizes and strides, its
    own version counter, no grad_fn, no view of an autograd base)."""
    import torch

    return t.data if isinstance(t, torch.Tensor) else t


def _unseen(values):
    """`args` or `kwargs` with each tensor (in a tuple or list too) as `_raw` gives it."""
    import torch

    def raw(v):
        if isinstance(v, torch.Tensor):
            return v.data
        if isinstance(v, (tuple, list)) and not hasattr(v, "_fields"):
            return type(v)(raw(x) for x in v)
        return v
    if isinstance(values, dict):
        return {k: raw(v) for k, v in values.items()}
    return tuple(raw(v) for v in values)


def _restorable(name: str, t) -> tuple[Any, Any]:
    """(what a restore of `t` writes, the copy it writes from), tried once: `t` with each broadcast
    (stride-0) dimension narrowed to its one element (an `expand`ed input's elements share one
    location), else, where its elements still overlap (`unfold`'s windows), the bytes it spans. None
    for an empty tensor. Raises, naming `t`, where neither can be written."""
    import torch

    from . import placement

    if t.numel() == 0:
        return None, None
    memory = t
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            memory = memory.narrow(d, 0, 1)
    found = memory.clone()
    try:
        with torch.no_grad():
            memory.copy_(found)   # the same values: a write that changes nothing, to learn that it can
        return memory, found
    except RuntimeError:
        pass
    try:
        memory = placement.span_bytes(torch, t)
        found = memory.clone()
        with torch.no_grad():
            memory.copy_(found)
        return memory, found
    except Exception as e:  # noqa: BLE001 - the check cannot put it back: `start` says so, unchecked
        raise Unrestorable(f"`{name}` cannot be put back as found: {type(e).__name__}: {e}"[:400]) from None


def _same(a, b) -> bool:
    """Whether two tensors hold the same bytes (NaN equal to NaN)."""
    import torch

    return bool(torch.equal(a, b)) or (a.dtype.is_floating_point and bool(torch.isclose(a, b, 0, 0, True).all()))


def _tensors(bound: dict) -> dict[str, Any]:
    """Every tensor the call passes, by label (`placement.members`: a tuple's items, a tensor descriptor's
    base too), each once: what a kernel can write through is compared and put back."""
    import torch

    from . import placement

    out, seen = {}, set()
    for n, v in bound.items():
        for label, t in placement.members(torch, v, n):
            if id(t) not in seen:
                seen.add(id(t))
                out[label] = t
    return out


def differs(got, want, p: Policy) -> str | None:
    """Where `got` differs from `want` beyond `p`'s tolerance (None: it does not)."""
    import torch

    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, not {tuple(want.shape)}"
    if got.dtype.is_floating_point or got.dtype.is_complex:
        rtol, atol = tolerance(got.dtype, p)
        wide = (torch.float32, torch.float64, torch.complex64, torch.complex128)
        g, w = (got, want) if got.dtype in wide else \
            (got.cfloat(), want.cfloat()) if got.dtype.is_complex else (got.float(), want.float())  # complex32
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
