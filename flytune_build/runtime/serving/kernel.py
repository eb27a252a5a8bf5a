"""What every tuned kernel of this process is: a ported `flytune_build.autotune` kernel
(`autotuner.Autotuned`) and an adopted `@triton.autotune` one (`adapters.adopted.Adopted`) alike.

`Kernel` declares the parts they share: the preamble (`declare`: name, configs as data, the config
pre_hooks, the binding rules), the checks an artifact must pass (`check_key`, `check_binds`), the
fallback warning, how a key not yet decided is decided (`decide`, by the mode's tier order) and
launch-or-fail (`launch_error`). Each kind supplies its tiers; the hot path of each stays its own.

What FLYTUNE_AUTOTUNE means, for both kinds (`ORDER`): a key not yet decided is served by the first
tier of its mode's order that answers.

    auto    scratch, offline, heuristic, search
    off     scratch, offline, heuristic, first       (=0: never search)
    strict  scratch, offline, then TierMissError     (a tuned config must serve)
    bundle  offline, then TierMissError              (an installed bundle must serve: the proof)
    search  search, its winner emitted               (=1: always search)

`bundle` proves what the installed bundles serve: the scratch cache (which holds every winner a
`flytune tune` found here) is skipped, the offline tier serves from installed bundles only (owner and
accepted packs; FLYTUNE_ARTIFACT_DIR is not read), and a key they do not serve is a TierMissError
saying why (no bundle holds the kernel, one holds it but does not own it, only for other devices,
not this key, its artifact rejected).

"first" is the first candidate a search would time (the declared configs after `prune_configs_by`,
in declared order), with its pre_hook: what Triton's Autotuner launches with one config. A kernel
that cannot time a search here (an adopted kernel on the interpreter, where Triton has no driver
and the kernel no `do_bench` of its own) takes "first" where `auto` would search. An adopted kernel
has no scratch or heuristic tier of its own (Triton's disk cache answers inside its search).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core import settings
from ...core.artifact import kernel_name
from ...core.codec import Fields
from ...core.config import Config, space_hash
from ...core.errors import ArtifactExecutionError, DeclarationError, FlytuneError, SettingsError
from .. import callbacks, device, warning
from ..binding import Binding
from . import registry
from .decision import Decision, Stats, failure, miss, unbundled

ORDER = {
    "auto": ("scratch", "offline", "heuristic", "search"),
    "off": ("scratch", "offline", "heuristic", "first"),
    "strict": ("scratch", "offline", "miss"),
    "bundle": ("offline", "miss"),
    "search": ("search",),
}


def must_hit(mode: str) -> bool:
    """Whether `mode` (a FLYTUNE_AUTOTUNE mode) raises where nothing tuned serves (`strict`, `bundle`):
    the rule Inductor serving follows for a kernel or GEMM choice Inductor would benchmark."""
    return ORDER[mode][-1] == "miss"


# what `strict` names as the fallback it forbids, and why "first" served
FALLBACK_NAMES = {"heuristic": "the heuristic", "search": "a search", "first": "the first config"}
FIRST_REASONS = {
    "off": "FLYTUNE_AUTOTUNE=0 and no heuristic default: using the first config",
    "auto": "the interpreter cannot time Triton's search (no driver, and the kernel has no do_bench of its "
            "own): using the first config",
}

Tier = Callable[[], "Decision | None"]


def order(mode: str, can_search: bool = True) -> tuple[str, ...]:
    """The tiers that may serve a key not yet decided under `mode`, in order."""
    tiers = ORDER[mode]
    if not can_search and mode != "search":
        tiers = tuple("first" if t == "search" else t for t in tiers)
    return tiers


def first_candidate(pruned: Sequence[Any], declared: Sequence[Config]) -> Any:
    """The first of `pruned` (a search's candidates) in the kernel's declared order; a config the
    pruner made up comes after every declared one, in the pruner's order."""
    position: dict[Config, int] = {}
    for i, c in enumerate(declared):
        position.setdefault(c, i)
    return min(pruned, key=lambda c: position.get(Config.coerce(c), len(position)))


class Kernel:
    """The declared base of a tuned kernel (see the module docstring)."""

    name: str
    validate: Callable | None
    _needed: tuple | None = None   # the parameters a launch must be given (`heuristic`), read once

    def declare(self, name: str, arg_names: Sequence[str], declared: Sequence[Any], axis_names: Sequence[str],
                **binding) -> None:
        """The preamble: the kernel's name checked, its configs as data (their pre_hooks in `hooks`), the
        rules a served config must follow (`binding`), its counters."""
        kernel_name(name, Fields(name, DeclarationError), "name")
        self.name = name
        self.arg_names = list(arg_names)
        self.declared = list(declared)
        self.configs = [Config.coerce(c) for c in self.declared]
        self.config_set = frozenset(self.configs)  # a config read from a cache must be one of them
        self.tuned_kwargs = Binding.tuned_types(self.configs)
        self.hooks = callbacks.ConfigHooks(self.arg_names, self.declared, self.configs)
        self.binding = Binding(name, tuple(self.arg_names), tuple(axis_names), self.tuned_kwargs, self.hooks.declared,
                               required=Binding.set_by_all(self.configs), **binding)
        self.space_hash = space_hash(self.configs)
        self._stats = Stats()

    def enroll(self) -> None:
        """Register this kernel (`registry.register`). With FLYTUNE_WARMUP=background, the first kernel an
        installed bundle lists starts that bundle's warm-up on a daemon thread (`warmup.on_register`), once
        per bundle: importing a tuned package is enough."""
        registry.register(self)
        try:
            background = settings.current().warmup == "background"
        except SettingsError:  # a bad FLYTUNE_* value: the kernel's first call says which, as without a warm-up
            return
        if background:
            from ..warming import warmup

            warmup.on_register(self.name)

    def decide(self, mode: str, key: dict, tiers: Mapping[str, Tier], can_search: bool = True) -> Decision | None:
        """The decision of the first tier of `mode`'s order that answers (`tiers`: what this kernel has,
        by tier name); None where none does (a warm-up, which never searches). Under `strict` a key no
        tuned tier serves raises `TierMissError`, naming the fallback `auto` would have taken; under
        `bundle`, one no installed bundle serves, saying why."""
        before = dict(self._stats.fallbacks)  # what this decision falls back for says why a bundle did not serve
        for tier in order(mode, can_search):
            if tier == "miss":
                if mode == "bundle":
                    raise unbundled(self.name, key, device.current(), self.unbundled_why(before))
                fallback = next((t for t in order("auto", can_search)[2:] if t in tiers), "search")
                raise miss(self.name, key, device.current(), FALLBACK_NAMES[fallback])
            step = tiers.get(tier)
            d = None if step is None else step()
            if d is not None:
                if tier == "first":
                    self.fallback(FIRST_REASONS["off" if mode == "off" else "auto"])
                return d
        return None

    def unbundled_why(self, before: dict) -> str:
        """Why no installed bundle served the key being decided: what this decision fell back for (an
        artifact rejected, only other devices bundled), else what is installed for this kernel."""
        said = [reason for reason, n in self._stats.fallbacks.items() if n > before.get(reason, 0)]
        if said:
            return "; ".join(said)
        from .offline import TIER

        return TIER.explain(self.name, device.current())

    def check_binds(self, config: Config, caller: set, what: str, file=None) -> None:
        """Raise unless `config` may be launched for a call passing `caller` (`binding.Binding.check`)."""
        self.binding.check(config, caller, what, file)

    def heuristic(self, returned: Any, bound: dict, fn: Callable) -> Config:
        """The config a `default` callback returned for a call (`bound`: its arguments by name), checked as
        a declaration is: a DeclarationError naming `default` where it returned no config, one that binds
        what it may not (`check_binds`), or one that leaves a parameter of `fn` with no default value
        unset where the call does not pass it either (the launch would fail on Triton's TypeError)."""
        try:
            config = Config.coerce(returned)
        except DeclarationError as e:
            raise DeclarationError(f"returned {type(returned).__name__}, which is no config: a heuristic default "
                                   f"returns a flytune_build.Config, a triton.Config or a dict of the kernel's "
                                   f"tuned parameters", file=self.name, field="default") from e
        self.check_binds(config, set(bound), "default")
        if self._needed is None:
            self._needed = _launch_parameters(fn)
        unset = [n for n in self._needed if n not in bound and n not in config.kwargs]
        if unset:
            raise DeclarationError(f"returned {config}, which leaves {', '.join(unset)} unset: a parameter of kernel "
                                   f"{self.name} with no default value that the call does not pass either",
                                   file=self.name, field="default")
        return config

    def check_key(self, key, file) -> None:
        """Raise an ArtifactError unless an artifact's key has the axes this kernel keys on."""
        self.binding.check_key(key, file)

    def launch_failed(self, d: Decision | None, e: Exception, args: tuple = (), kwargs: dict | None = None) -> None:
        """A launch of the call (`args`, `kwargs`) served by `d` raised `e` (called in its handler): returns
        where the next tier serves instead (a config pack's config, refused: the caller calls again);
        raises otherwise, the accepted artifact's failure naming it (`launch_error`), or `e` itself."""
        err = launch_error(d, e, (self.arg_names, args, kwargs))
        if err is None:
            raise e
        if not self.refused_pack(d, e):
            raise err from e

    def refused_pack(self, d: Decision | None, e: Exception) -> bool:
        """A config pack's config that failed to launch: the owner never accepted it, so it is refused
        with one warning and the key decided again (the next tier serves); True when `d` was one. An
        owner's artifact that fails is never refused: `launch_error` names it."""
        if d is None or d.tier != "offline" or not d.pack or isinstance(e, FlytuneError):
            return False
        self.fallback(f"config pack {d.pack}: {d.origin} failed to launch ({type(e).__name__}: "
                      f"{str(e).strip()[:200]}); refused, the next tier serves")
        self.forget_pack(d)
        return True

    def forget_pack(self, d: Decision) -> None:
        """Take a refused pack decision out of this kernel's tiers (each kind knows where it keeps them)."""
        raise NotImplementedError

    def rediscover(self) -> None:
        """Forget what was derived from the settings before they changed (`rediscover` below): the offline
        tier, found again from the settings now in force when the next key is decided."""
        raise NotImplementedError

    def fallback(self, reason: str) -> None:
        """Count `reason` and warn once per kernel and reason."""
        self._stats.fallback(reason)
        warning.once((self.name, reason), f"flytune: kernel {self.name}: {reason}")

    def emit(self, artifact) -> None:
        """FLYTUNE_AUTOTUNE=1 with FLYTUNE_EMIT_DIR: save a searched winner's artifact there. One that cannot
        be saved is said (one warning per artifact: the setting, the path, why) and the winner still
        serves: its search is neither lost for this process nor made again."""
        out = settings.current().emit_dir
        if out is None:
            return
        try:
            if out.exists() and not out.is_dir():
                raise OSError(f"{out} is not a directory")
            artifact.save(out)
        except (OSError, FlytuneError) as e:
            warning.once(("emit", artifact.filename, str(out)),
                         f"flytune: kernel {self.name}: the searched winner for key {artifact.key} was not saved "
                         f"to FLYTUNE_EMIT_DIR={out} ({e}); it still serves this process: make FLYTUNE_EMIT_DIR a "
                         f"directory this process can write")

    def stats(self) -> dict:
        """This kernel's counters (see `flytune_build.stats()`)."""
        return self._stats.to_json()


def rediscover() -> None:
    """The settings changed when the process's first key was decided (`core.settings.settle`: set after
    `import mylib`, before the first kernel call): the device, the offline tier's sources and every
    kernel's offline tier are found again from them, ported and adopted kernels alike."""
    from . import registry
    from .offline import TIER

    device.reset()
    TIER.reset()
    for k in registry.kernels().values():
        k.rediscover()


settings.on_change(rediscover)


def _launch_parameters(fn: Callable) -> tuple[str, ...]:
    """The parameters of the Python function under `fn` with no default value that no `@triton.heuristics`
    wrapper sets: a launch must be given each."""
    import inspect

    from ..wrapping import chain, heuristic_names

    python = next((o for o in chain(fn) if inspect.isfunction(o)), None)
    derived = heuristic_names(fn)
    return tuple(n for n, p in (inspect.signature(python).parameters.items() if python else ())
                 if p.default is p.empty and n not in derived)


def launch_error(d: Decision | None, e: Exception, call: tuple | None = None) -> ArtifactExecutionError | None:
    """Launch-or-fail: the error a failed launch of `d`'s config raises instead of `e`: an accepted
    artifact's failure names it (never retried with a default); None: `e` stands, as it does for a
    failure the call (`call`: the kernel's parameter names, the call's args and kwargs) makes whatever
    config serves it (`call_fault`), noted as the call's own."""
    if d is None or d.tier != "offline":
        return None
    why = call_fault(d, *call) if call is not None else None
    if why is None:
        return failure(d, e)
    if hasattr(e, "add_note"):   # Python 3.11+
        e.add_note(f"flytune: the call's own error, not the accepted artifact {d.origin}'s: {why}")
    return None


def call_fault(d: Decision, names: Sequence[str], args: tuple, kwargs: dict | None) -> str | None:
    """Why a call fails whatever config serves it (None: nothing seen): more positional arguments than
    the kernel has parameters, an argument (by position or keyword) the served config passes too, an
    integer no launch passes."""
    if len(args) > len(names):
        return f"it passes {len(args)} positional arguments to a kernel of {len(names)} parameters"
    kwargs = kwargs or {}
    clash = sorted((set(names[:len(args)]) | set(kwargs)) & set(d.launch) - {"warmup", "grid"})
    if clash:
        return f"it passes {', '.join(clash)}, which the config it is served sets"
    big = next((v for v in (*args, *kwargs.values()) if type(v) is int and not -2 ** 63 <= v < 2 ** 64), None)
    if big is not None:
        return f"it passes the integer {big}, wider than the 64 bits a launch passes"
    return None
