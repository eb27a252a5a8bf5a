"""What a config may bind and which key an artifact may have, for one kernel: the rules the runtime
applies to every artifact it serves and `flytune verify --deep` to every artifact it checks.

A config binds only tuned parameters the caller did not pass and that are not key parameters, with
the types the declared configs use (or a backend's launch-keyword compiler option, `waves_per_eu`, where
the declared configs set it); an artifact's config sets every parameter that every declared config sets
(one some declared config leaves to the kernel's default, it may leave too), and when any
declared config has a `pre_hook` it must be one of the declared configs (a hook is code: it is
re-attached from the declaration, never read from an artifact).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import options
from ..core.codec import Fields
from ..core.config import Config
from ..core.errors import ArtifactError, DeclarationError


@dataclass(frozen=True)
class Binding:
    kernel: str
    arg_names: tuple[str, ...]
    axis_names: tuple[str, ...]     # the declared key parameters
    tuned_kwargs: dict              # parameter -> the types its declared values have (`tuned_types`)
    declared: frozenset = frozenset()  # the declared configs, when any has a pre_hook; else empty
    open_axes: bool = False         # adopted kernels: other parameters may be axes too (their dtype, or null)
    optional_axes: frozenset = frozenset()  # adopted kernels: key names a call may leave out (Triton skips them)
    required: frozenset = frozenset()  # the parameters every declared config sets: an artifact sets them too

    def check(self, config: Config, caller: set, what: str, file=None) -> None:
        """Raise unless `config` binds only tuned, uncalled, non-key parameters with the declared types;
        for an artifact (`file` given, an ArtifactError) it must also set every parameter each declared
        config sets (`required`) and, where the declared configs carry pre_hooks, be one of them."""
        f = Fields(file or self.kernel, ArtifactError if file else DeclarationError)
        for name, value in config.kwargs.items():
            path = f"{what}.kwargs.{name}"
            if name not in self.arg_names and not self._backend_option(name, file):
                f.fail(path, f"binds to no parameter of kernel {self.kernel}" + (
                    f" (a compiler option of Triton's {' and '.join(options.BACKEND_KWARGS[name])} backend, "
                    f"which none of the kernel's declared configs sets)" if name in options.BACKEND_KWARGS else ""))
            if name in self.axis_names:
                f.fail(path, "overrides a key parameter")
            if name in caller:
                f.fail(path, "overrides an argument the caller passed")
            if file is not None and name not in self.tuned_kwargs:  # data never sets what is not tuned
                f.fail(path, f"sets a parameter of kernel {self.kernel} that none of its declared configs tunes")
            want = self.tuned_kwargs.get(name)
            if want is not None and type(value) not in want and not (float in want and type(value) is int):
                f.fail(path, f"must be {' or '.join(sorted(t.__name__ for t in want))} like the declared configs, "
                             f"not {type(value).__name__}")
        if file is not None:
            unset = self.required - set(config.kwargs)
            if unset:
                f.fail(f"{what}.kwargs", f"does not set {', '.join(sorted(unset))}")
            if self.declared and config not in self.declared:
                f.fail(what, f"matches none of kernel {self.kernel}'s declared configs, which carry pre_hooks: "
                             f"a config is never launched without its hook")

    @staticmethod
    def tuned_types(configs) -> dict:
        """parameter -> frozenset of the types the declared `configs` give it (a parameter declared 1 in one
        config and 0.5 in another takes either)."""
        types: dict = {}
        for c in configs:
            for k, v in c.kwargs.items():
                types.setdefault(k, set()).add(type(v))
        return {k: frozenset(v) for k, v in types.items()}

    @staticmethod
    def set_by_all(configs) -> frozenset:
        """The parameters every one of the declared `configs` sets."""
        sets = [set(c.kwargs) for c in configs]
        return frozenset(set.intersection(*sets)) if sets else frozenset()

    def _backend_option(self, name: str, file) -> bool:
        """A backend's launch-keyword compiler option: a declared config may set it, an artifact only
        where the declared configs do (Triton checks it against the device's backend at launch)."""
        return name in options.BACKEND_KWARGS and (file is None or name in self.tuned_kwargs)

    def check_key(self, key, file) -> None:
        """Raise an ArtifactError unless an artifact's key has the axes this kernel keys on."""
        got, declared = set(key), set(self.axis_names)
        if not self.open_axes:
            if got != declared:
                raise ArtifactError(f"has key axes {sorted(got)}, but the decorator declares {sorted(declared)}",
                                    file=file, field="key")
            return
        if not declared - self.optional_axes <= got:
            raise ArtifactError(f"has key axes {sorted(got)}, which lack the decorator's key "
                                f"{sorted(declared - self.optional_axes - got)}", file=file, field="key")
        stray = sorted(got - set(self.arg_names))
        if stray:
            raise ArtifactError(f"has key axes {stray}, which are not parameters of kernel {self.kernel}",
                                file=file, field="key")
