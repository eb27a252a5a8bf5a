"""Typed errors. Each names the file, the field (dotted key / JSON path) and the rule broken."""
from __future__ import annotations


class FlytuneError(Exception):
    """Base of every error flytune raises on purpose."""

    def __init__(self, rule: str, *, file: object = None, field: str | None = None):
        self.file = None if file is None else str(file)
        self.field = field or None
        self.rule = rule
        super().__init__(self.render())

    def relocate(self, file: object) -> None:
        """Name another file (a build names the path relative to the project root)."""
        self.file = None if file is None else str(file)
        self.args = (self.render(),)

    def render(self) -> str:
        """The message, safe to print: what came from data (a file name, a field, a value) may hold
        control characters, escapes, bidi overrides; they are written as Python escapes."""
        where = f"{self.file}: " if self.file else ""
        if self.field:
            return printable(f"{where}Field `{self.field}` {self.rule}")
        return printable(f"{where}{self.rule}")

    def __reduce__(self):  # crosses process boundaries intact (parallel collection)
        return (_rebuild, (type(self), self.rule, self.file, self.field))

    def to_json(self) -> dict:
        return {"type": type(self).__name__, "file": self.file, "field": self.field, "rule": self.rule,
                "message": str(self)}


class ArtifactError(FlytuneError):
    """An artifact file breaks the format."""


class ProjectError(FlytuneError):
    """`[tool.flytune]` in pyproject.toml is invalid."""


class DeviceError(FlytuneError):
    """A device identity or target declaration is invalid."""


class BundleError(FlytuneError):
    """A bundle (manifest, shard, wheel) is invalid or does not match its hashes."""


class DeclarationError(FlytuneError, ValueError):
    """An `autotune` declaration names something the kernel does not have."""


class SearchError(FlytuneError, RuntimeError):
    """Every candidate config failed during a search."""


class ArtifactExecutionError(FlytuneError, RuntimeError):
    """An accepted artifact failed to compile or launch; never retried with a default."""


class TierMissError(FlytuneError, RuntimeError):
    """FLYTUNE_AUTOTUNE=strict: a call no tuned config serves would fall back to the heuristic or a search."""


class SettingsError(FlytuneError, ValueError):
    """An environment variable flytune reads holds an invalid value."""


class ScratchError(FlytuneError):
    """The scratch cache file is unreadable or not a scratch cache."""


class InputError(FlytuneError):
    """A path or argument given to a command is not what the command needs."""


class OutputError(FlytuneError, OSError):
    """A file flytune must write cannot be (a file where a directory must be, a directory where the file
    goes, no permission, a full disk). An OSError too: best-effort writers handle it as one."""


class TuneError(FlytuneError, RuntimeError):
    """A tuning run could not go on (no worker started, a result from the wrong device)."""


class UsageError(FlytuneError, ValueError):
    """A request that cannot run as asked (a bad option, an empty plan, an executor that is not here);
    nothing was done. The CLI's exit code 2."""


class PlanError(ProjectError, UsageError):
    """A tuning plan entry `flytune tune` cannot use as written (a `reference` that is malformed, does not
    import or is not a function); nothing was tuned. A ProjectError naming the file and field, and a
    UsageError: the CLI's exit code 2."""


class NoTable(ProjectError, UsageError):
    """A command that needs `[tool.flytune]` run on a project without one (`flytune init` writes it):
    the CLI's exit code 2, as for every request that cannot run as asked."""


class NoProject(ProjectError, UsageError):
    """A command run where there is no `pyproject.toml` (from inside the package, or elsewhere): the CLI's
    exit code 2, as for a missing `[tool.flytune]`."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type (one string where a list of paths goes): refused, never iterated.
    A UsageError (the CLI's exit code 2) and a TypeError."""


class BuildFailure(FlytuneError):
    """Verification failed in strict mode: no wheel is written. Its message is one line per problem."""

    def render(self) -> str:
        # the line breaks are the message's own; each line's data was escaped where it was rendered
        where = printable(f"{self.file}: ") if self.file else ""
        return "\n".join(printable(line) for line in f"{where}{self.rule}".split("\n"))


class FlytuneWarning(UserWarning):
    """A fallback or an ignored input; the next tier serves."""


def _rebuild(cls, rule, file, field):
    return cls(rule, file=file, field=field)


def printable(text: str) -> str:
    """`text` safe to print on a terminal: control, format and lone surrogate characters (a newline, an
    escape sequence, a bidi override, an undecodable byte of a file name) written as Python escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(e: BaseException, *, with_type: bool = True, limit: int = 300) -> str:
    """An exception as one line, at most `limit` characters: its type and the first non-empty line of its
    message (a compiler's thousands of lines, a remote traceback: the first says what failed). A
    flytune error's line is flytune's own, naming the file, the field and the fix: up to 2,000 characters,
    so a long path never cuts the fix off."""
    if isinstance(e, FlytuneError):
        limit = max(limit, 2000)
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if with_type or not text:
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def foreign_failure(e: BaseException) -> bool:
    """Whether an exception from code flytune runs but does not own (a package's import, a tuning setup,
    a kernel, a validate) is that code's failure, to report and go on: everything but the user's
    KeyboardInterrupt, so SystemExit (`sys.exit` at import), pytest's Skipped and other BaseExceptions too."""
    return not isinstance(e, KeyboardInterrupt)


def within(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` in `exc`'s chain, where a library wrapped it in errors of its own:
    its `inner_exception` (Inductor's), or the exception it was raised from or while handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 32:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None

