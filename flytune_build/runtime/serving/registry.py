"""Every tuned kernel of this process, by name: `flytune_build.autotune` kernels and adopted
`@triton.autotune` kernels alike, so `flytune_build.stats()`, `flytune verify --deep` and tools see both.

A registered kernel has `name`, `validate` (None or `validate(key)`), `arg_names`, `tuned_kwargs`,
`stats()` (the shape `decision.Stats.render` gives), `reset()`, and for `verify --deep`:
`check_key(key, file)` and `check_binds(config, caller, what, file)` (raise an `ArtifactError` naming
the rule an artifact breaks) and `forcing(config)` (a context in which every call launches `config`).

Every kernel, ported or adopted, registers here through `Kernel.enroll`, which with
FLYTUNE_WARMUP=background also starts the warm-up of the bundle that lists it.
"""
from __future__ import annotations

from typing import Any

_kernels: dict[str, Any] = {}


def register(kernel: Any) -> None:
    """Register `kernel` under its name (a later kernel of the same name replaces it)."""
    _kernels[kernel.name] = kernel


def unregister(kernel: Any) -> None:
    """Forget `kernel` under every name it is registered by (an adopted kernel renamed by a second `adopt`)."""
    for name in [n for n, k in list(_kernels.items()) if k is kernel]:
        _kernels.pop(name, None)


def kernel(name: str) -> Any | None:
    """The registered kernel named `name`, or None."""
    return _kernels.get(name)


def kernels() -> dict[str, Any]:
    """Every registered kernel, by name."""
    return dict(sorted(_kernels.items()))


def stats() -> dict:
    """Per-kernel counters: calls per tier, searches, seconds searching, fallbacks with reasons."""
    return {name: k.stats() for name, k in kernels().items()}


def reset() -> None:
    """Reset every registered kernel's decisions and counters."""
    for k in list(_kernels.values()):   # a kernel registered meanwhile (another thread's import) is new anyway
        k.reset()
