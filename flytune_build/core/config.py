"""One launch configuration: constexpr kwargs plus compiler options, JSON scalars only."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import options
from .codec import Fields, canonical
from .errors import DeclarationError
from .options import DEFAULTS

COMPILER_OPTIONS = options.NAMES  # the attribute order below: num_warps, num_stages, num_ctas, maxnreg
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Config:
    """A JSON-serialisable launch config, hashable and immutable.

    `flytune_build.Config({"BLOCK": 1024}, num_warps=8)` mirrors `triton.Config`.
    """

    __slots__ = ("_canonical", "_launch", "kwargs", "maxnreg", "num_ctas", "num_stages", "num_warps")

    def __init__(self, kwargs: Mapping[str, Any] | None = None, num_warps: int = DEFAULTS["num_warps"],
                 num_stages: int = DEFAULTS["num_stages"], num_ctas: int = DEFAULTS["num_ctas"],
                 maxnreg: int | None = DEFAULTS["maxnreg"]):
        kwargs = dict(kwargs or {})
        f = Fields("<config>", DeclarationError)
        for name, value in kwargs.items():
            f.string(name, "kwargs", _IDENT, "a Python identifier")
            if name in COMPILER_OPTIONS:
                f.fail(f"kwargs.{name}", "is a compiler option: pass it as a keyword, not a kernel kwarg")
            f.scalar(value, f"kwargs.{name}")
        opts = options.check({"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas,
                              "maxnreg": maxnreg}, f)
        self._set(kwargs, *opts)

    def _set(self, kwargs, num_warps, num_stages, num_ctas, maxnreg):
        setattr_ = object.__setattr__
        setattr_(self, "kwargs", kwargs)
        setattr_(self, "num_warps", num_warps)
        setattr_(self, "num_stages", num_stages)
        setattr_(self, "num_ctas", num_ctas)
        setattr_(self, "maxnreg", maxnreg)
        launch = dict(kwargs, num_warps=num_warps, num_stages=num_stages)
        if num_ctas != 1:  # 1 is every backend's default: one keyword less on the hot path
            launch["num_ctas"] = num_ctas
        if maxnreg is not None:
            launch["maxnreg"] = maxnreg
        setattr_(self, "_launch", launch)
        setattr_(self, "_canonical", None)

    def __reduce__(self):  # validated when made; unpickling (parallel collection) trusts that
        return (_trusted, (self.kwargs, self.num_warps, self.num_stages, self.num_ctas, self.maxnreg))

    def __setattr__(self, name, value):
        raise AttributeError("Config is immutable")

    def launch_kwargs(self) -> dict:
        """Keyword arguments for `JITFunction.run` (shared: do not mutate)."""
        return self._launch

    def to_json(self) -> dict:
        return {"kwargs": dict(self.kwargs), "num_warps": self.num_warps, "num_stages": self.num_stages,
                "num_ctas": self.num_ctas, "maxnreg": self.maxnreg}

    @classmethod
    def from_json(cls, value: Any, f: Fields, path: str = "config") -> Config:
        kwargs, opts = check_json(value, f, path)
        return _trusted(dict(kwargs), *opts)

    @classmethod
    def coerce(cls, config: Any) -> Config:
        """Accept our Config, a `triton.Config` (duck-typed, no import) or a JSON dict: an artifact's
        `{"kwargs": {"BLOCK": 64}, "num_warps": 4}`, or the kwargs themselves with any compiler option
        beside them, `{"BLOCK": 64, "num_warps": 4}`.

        Of a `triton.Config` only the data is kept: its `pre_hook` is code, which the runtime keeps
        beside the declared config and re-attaches (`runtime.callbacks`); an `ir_override` is refused."""
        if isinstance(config, Config):
            return config
        if isinstance(config, Mapping):
            doc = dict(config)
            if "kwargs" not in doc:  # the kwargs themselves, compiler options beside them
                doc = {"kwargs": {k: v for k, v in doc.items() if k not in COMPILER_OPTIONS},
                       **{k: v for k, v in doc.items() if k in COMPILER_OPTIONS}}
            return cls.from_json(doc, Fields("<config>", DeclarationError))
        if hasattr(config, "kwargs") and hasattr(config, "num_warps"):
            if getattr(config, "ir_override", None) is not None:
                raise DeclarationError("sets ir_override, a file of compiled IR that an artifact cannot carry",
                                       field="configs")
            return cls(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages,
                       num_ctas=getattr(config, "num_ctas", DEFAULTS["num_ctas"]),
                       maxnreg=getattr(config, "maxnreg", DEFAULTS["maxnreg"]))
        raise DeclarationError(f"must be a flytune_build.Config, a triton.Config or a dict, not "
                               f"{type(config).__name__}", field="configs")

    def canonical(self) -> bytes:
        """The config's canonical JSON: what equality means (True and 1 are different kwargs)."""
        if self._canonical is None:
            object.__setattr__(self, "_canonical", canonical(self.to_json()))
        return self._canonical

    def __eq__(self, other):
        return isinstance(other, Config) and self.canonical() == other.canonical()

    def __hash__(self):
        return hash(self.canonical())

    def __repr__(self):
        kw = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        opts = f"num_warps={self.num_warps}, num_stages={self.num_stages}, num_ctas={self.num_ctas}"
        if self.maxnreg is not None:
            opts += f", maxnreg={self.maxnreg}"
        return f"Config({kw + ', ' if kw else ''}{opts})"

    __str__ = __repr__


def _trusted(kwargs, num_warps, num_stages, num_ctas, maxnreg) -> Config:
    config = object.__new__(Config)
    config._set(kwargs, num_warps, num_stages, num_ctas, maxnreg)
    return config


def check_json(value: Any, f: Fields, path: str = "config") -> tuple[dict, tuple]:
    """Validate a config document; returns (kwargs, (num_warps, num_stages, num_ctas, maxnreg))."""
    f.table(value, path, ("kwargs",), COMPILER_OPTIONS)
    kw = f.mapping(value["kwargs"], f"{path}.kwargs")
    for name, v in kw.items():
        if not _IDENT.fullmatch(name):
            f.string(name, f"{path}.kwargs", _IDENT, "a Python identifier (kwarg name)")
        if name in COMPILER_OPTIONS:
            f.fail(f"{path}.kwargs.{name}", "is a compiler option and belongs beside `kwargs`")
        f.scalar(v, f"{path}.kwargs.{name}")
    return kw, options.check(value, f, path)


def space_hash(configs) -> str:
    """Hash of a search space, independent of nothing but its configs and their order."""
    import hashlib

    return hashlib.sha256(canonical([c.to_json() for c in configs])).hexdigest()
