"""Code a declaration attaches to a kernel, called the way Triton calls it.

- A declared `triton.Config`'s `pre_hook(nargs)` runs before every launch of that config, in a search
  and on every tier, with `nargs = {**arguments by name, **call kwargs, **config.all_kwargs()}`. A hook
  is code, so it never enters an artifact: a served config gets the hook of the declared config with
  the same data (`ConfigHooks.bind`), and `binding` refuses an artifact of a hooked kernel that is none
  of its declared configs.
- `autotune(pre_hook=..., post_hook=...)` run around each candidate of a search (`pre_hook(nargs)`
  before, `post_hook(nargs, exception=...)` after), and `pre_hook(nargs, reset_only=True)` once the
  winner is known; as in Triton, never around an ordinary launch.
- `do_bench(kernel_call, quantiles)` has Triton's signature (a one-argument `do_bench(fn)` works too);
  `use_cuda_graph=True` times with `triton.testing.do_bench_cudagraph` on a GPU.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ..core.config import Config

QUANTILES = (0.5, 0.2, 0.8)  # what Triton's Autotuner asks a do_bench for: the median comes first


def all_kwargs(config: Any) -> dict:
    """`triton.Config.all_kwargs()`: the constexpr kwargs and every compiler option that is set."""
    own = getattr(config, "all_kwargs", None)
    if own is not None:
        return own()
    c = Config.coerce(config)
    opts = {"num_warps": c.num_warps, "num_ctas": c.num_ctas, "num_stages": c.num_stages, "maxnreg": c.maxnreg}
    return {**c.kwargs, **{k: v for k, v in opts.items() if v is not None}}


class ConfigHooks:
    """The pre_hooks of one kernel's declared configs, by the configs' data."""

    __slots__ = ("arg_names", "by_config", "declared")

    def __init__(self, arg_names: Sequence[str], declared: Sequence[Any], configs: Sequence[Config]):
        self.arg_names = tuple(arg_names)
        self.by_config: dict[Config, Any] = {}
        for obj, config in zip(declared, configs):
            if getattr(obj, "pre_hook", None) is not None:
                self.by_config.setdefault(config, obj)
        self.declared = frozenset(configs) if self.by_config else frozenset()  # what an artifact may be

    def __bool__(self) -> bool:
        return bool(self.by_config)

    def owner(self, config: Config, source: Any = None) -> Any:
        """The object whose pre_hook `config` launches with: `source` when it has one (a `triton.Config` a
        heuristic or a pruner returned), else the declared config with the same data; None when none has."""
        return source if getattr(source, "pre_hook", None) is not None else self.by_config.get(config)

    def bind(self, config: Config, source: Any = None) -> Callable[[tuple, dict], None] | None:
        """`hook(args, kwargs)` calling the pre_hook for `config` (`owner`); None when there is none."""
        source = self.owner(config, source)
        if source is None:
            return None
        names, pre_hook, launch = self.arg_names, source.pre_hook, all_kwargs(source)

        def hook(args: tuple, kwargs: dict) -> None:
            pre_hook({**dict(zip(names, args)), **kwargs, **launch})
        return hook


def timer(do_bench: Callable | None, use_cuda_graph: bool, rep: float, interpreted: bool) -> Callable | None:
    """The kernel's own timer as `fn -> ms` (or a list, median first); None: flytune's timers."""
    if do_bench is None:
        if not use_cuda_graph or interpreted:  # no graphs on the CPU interpreter: its wall clock times
            return None

        def graphed(fn):
            from triton.testing import do_bench_cudagraph

            return do_bench_cudagraph(fn, rep=rep, quantiles=QUANTILES)
        return graphed
    if _takes_quantiles(do_bench):
        return lambda fn: do_bench(fn, quantiles=QUANTILES)
    return do_bench


def _takes_quantiles(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin: assume Triton's signature
        return True
    return any(p.name == "quantiles" or p.kind is p.VAR_KEYWORD for p in params)


class Launcher:
    """Launches one search candidate as Triton's `Autotuner._bench` does: the config's pre_hook, the
    inputs made fresh (`reset_to_zero`, `restore_value`), the autotune `pre_hook`, the launch, the
    `post_hook`; `settle(winner)` is Triton's closing `pre_hook(nargs, reset_only=True)`. A launch runs
    on one of the call's `placement.Site`s, the caller's own tensors unless `at` chose another."""

    def __init__(self, kernel, grid, fresh_inputs: Callable[..., None], sites: list, sources: dict | None = None):
        self.kernel, self.grid, self.fresh_inputs, self.sites = kernel, grid, fresh_inputs, sites  # shared, not copied
        self.sources = sources or {}  # config -> the pruner-made triton.Config carrying its pre_hook
        self.pre_hook, self.post_hook = kernel.search_hooks
        self._turns: dict[Config, int] = {}

    def at(self, config: Config) -> Callable[[], None]:
        """A launch of `config` on its next placement: every config visits the placements in one order."""
        turn = self._turns.get(config, 0)
        self._turns[config] = turn + 1
        site = self.sites[turn % len(self.sites)]
        return lambda: self(config, site)

    def nargs(self, config: Config, site=None) -> dict:
        site = site or self.sites[0]
        return {**dict(zip(self.kernel.arg_names, site.args)), **site.kwargs, **all_kwargs(config)}

    def __call__(self, config: Config, site=None) -> None:
        site = site or self.sites[0]
        hook = self.kernel.hooks.bind(config, self.sources.get(config))
        if hook is not None:
            hook(site.args, site.kwargs)
        self.fresh_inputs(site.bound)
        nargs = self.nargs(config, site) if self.pre_hook or self.post_hook else None
        if self.pre_hook is not None:
            self.pre_hook(nargs)
        try:
            self.kernel.fn.run(*site.args, grid=self.grid, warmup=False, **site.kwargs, **config.launch_kwargs())
        except Exception as e:
            if self.post_hook is not None:
                self.post_hook(nargs, exception=e)
            raise
        if self.post_hook is not None:
            self.post_hook(nargs, exception=None)

    def settle(self, winner: Config) -> None:
        if self.pre_hook is not None:
            self.pre_hook(self.nargs(winner), reset_only=True)
