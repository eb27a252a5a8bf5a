"""Adapters for kernels decorated with `@triton.autotune`: they get the offline tier as they are.

`adopt(kernel, name=...)` seeds the Autotuner's in-memory cache with the bundled configs for this
device, keyed exactly as the installed Triton keys it, so a tuned shape benchmarks nothing.
`recording(kernel, name=...)` captures the winners of a tuning run as flytune artifacts.

Triton >= 3.0 keys its cache on the key arguments' values followed by `str(dtype)` of every tensor
argument, in parameter order (`Autotuner.run`); older releases on the key values alone. An artifact
of an adopted kernel therefore holds the decorator's key axes plus one axis per tensor argument
(its dtype): that is what the cache key depends on.
"""
from __future__ import annotations

import contextlib
import math

from ...core.artifact import Artifact
from ...core.config import Config, space_hash
from ...core.errors import DeclarationError, FlytuneError
from ...core.key import dtype_name
from ...core.target import match_level
from .. import device, identity
from ..bench import Candidate
from ..offline import TIER


def _dtypes_in_key() -> bool:
    import triton
    from packaging.version import Version

    return Version(triton.__version__).major >= 3


def _check(kernel) -> None:
    if not (hasattr(kernel, "cache") and hasattr(kernel, "keys") and hasattr(kernel, "arg_names")):
        raise DeclarationError("must be a kernel decorated with @triton.autotune (a triton Autotuner)",
                               field="kernel")


def _to_triton(config: Config):
    import triton

    return triton.Config(dict(config.kwargs), num_warps=config.num_warps, num_stages=config.num_stages,
                         num_ctas=config.num_ctas, maxnreg=config.maxnreg)


def adopt(kernel, name: str) -> int:
    """Seed `kernel.cache` with every bundled config for this device; returns how many were seeded.

    On a device no artifact matches, seeds nothing: Triton behaves exactly as before.
    """
    _check(kernel)
    hits = _hits(kernel, name)
    seeded = 0
    for triton_key, config in hits:
        kernel.cache.setdefault(triton_key, _to_triton(config))
        seeded += 1
    return seeded


def _hits(kernel, name):
    keys = list(kernel.keys)
    with_dtypes = _dtypes_in_key()
    out = []
    dev = device.current()
    for src in TIER.sources():
        for doc, art_dev, accept, _, _ in TIER.documents(src, name):
            level = match_level(art_dev, dev)
            if level is None or level not in accept:
                continue
            try:
                art = Artifact.from_json(doc)
            except FlytuneError:
                continue
            key = art.key
            if any(k not in key for k in keys):
                continue
            tensors = [a for a in kernel.arg_names if a in key and a not in keys]
            triton_key = tuple(key[k] for k in keys)
            if with_dtypes:
                triton_key += tuple(f"torch.{key[a]}" for a in tensors)
            out.append((triton_key, art.config))
    return out


@contextlib.contextmanager
def recording(kernel, name: str):
    """Within the block, every search the Autotuner runs is captured; yields the list of artifacts."""
    _check(kernel)
    captured: list[Artifact] = []
    original = kernel.run
    keys = list(kernel.keys)

    def run(*args, **kwargs):
        before = set(kernel.cache)
        ret = original(*args, **kwargs)
        new = set(kernel.cache) - before
        if new:
            bound = dict(zip(kernel.arg_names, args))
            bound.update({k: v for k, v in kwargs.items() if k in kernel.arg_names})
            for triton_key in new:
                key = {k: bound[k] for k in keys if k in bound}
                for a, v in bound.items():
                    if hasattr(v, "dtype") and a not in keys:
                        key[a] = dtype_name(v.dtype)
                winner = Config.coerce(kernel.cache[triton_key])
                timings = getattr(kernel, "configs_timings", None) or {}
                cands = []
                for cfg, t in timings.items():
                    t0 = float(t[0] if isinstance(t, (list, tuple)) else t)
                    cands.append(Candidate(Config.coerce(cfg), t0 if math.isfinite(t0) else math.inf))
                prov = identity.provenance(cands, space_hash([Config.coerce(c) for c in kernel.configs]), "measured")
                captured.append(Artifact(name, key, device.current(), winner, prov))
        return ret

    kernel.run = run
    try:
        yield captured
    finally:
        del kernel.run  # the instance attribute goes; the class's method serves again
