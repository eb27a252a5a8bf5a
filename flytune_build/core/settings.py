"""Every environment variable flytune reads, read in one place.

`current()` reads the environment once and keeps the result; `settle()`, at the process's first
decision of a key, reads it once more (settings set after `import mylib` but before the first kernel
call take effect); `reload()` reads it again (tests, `flytune_build.reset_stats()`);
`override(**changes)` is a context in which some settings differ
(`flytune tune` forces search), restoring exactly what was there on exit. An invalid value of any
`FLYTUNE_*` variable is a `SettingsError` naming the variable; nothing here writes `os.environ`.

State: the settings read from the environment are the process's (one value, `_process`); an override
belongs to the context that entered it (a `ContextVar`): the thread inside `override()` sees it, and
so does code it runs with `contextvars.copy_context()`; every other thread keeps the process's
settings. A forked child inherits both as they were. One thread settles, under `_lock`; a thread
meeting it waits until the settings are read again and every `on_change` listener has run, so no
decision is made under the provisional settings (once settled, `settle` takes no lock).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from . import serving
from .errors import SettingsError

# FLYTUNE_AUTOTUNE: which tiers serve a key not yet decided
AUTOTUNE_MODES = {"": "auto", "auto": "auto", "1": "search", "search": "search", "0": "off", "off": "off",
                  "strict": "strict", "bundle": "bundle"}
RANKINGS = ("measured", "synthetic")


@dataclass(frozen=True)
class Settings:
    # auto | search (always search) | off (never search) | strict (must hit) | bundle (only an installed bundle)
    autotune: str = "auto"
    ranking: str = "measured"       # measured | synthetic (a deterministic ranking, never a measurement)
    print_autotuning: bool = False  # FLYTUNE_PRINT_AUTOTUNING=1: one line per decision on stderr
    emit_dir: Path | None = None    # FLYTUNE_EMIT_DIR: with autotune=search, each winner is saved here
    device: str | None = None       # FLYTUNE_DEVICE: a device spec overriding detection
    interpret: bool = False         # TRITON_INTERPRET: kernels run on Triton's CPU interpreter
    artifact_dirs: tuple[Path, ...] = ()  # FLYTUNE_ARTIFACT_DIR: directories searched before bundles
    cache_dir: Path | None = None   # FLYTUNE_CACHE_DIR: the scratch cache (default: the user cache dir)
    flydsl_dir: str | None = None   # FLYDSL_AUTOTUNE_CONFIG_DIR: FlyDSL's own offline-config directory
    source_date_epoch: int | None = None  # SOURCE_DATE_EPOCH: the timestamp of every wheel member
    ci: bool = False                # CI: set on shared runners, which never pick winners
    # CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES: the GPUs this process may use; `flytune tune
    # --executor local` pins one per worker from them
    visible_devices: tuple[tuple[str, str], ...] = ()
    # FLYTUNE_PACKS: config packs the user accepts for any kernel, beyond those each kernel's owner
    # accepts: distribution names (normalised), or ("*",) for every installed pack
    packs: tuple[str, ...] = ()
    warmup: str = "off"             # FLYTUNE_WARMUP=background: a bundle's kernel, once registered, starts its warm-up
    misses: Path | None = None      # FLYTUNE_MISSES: the file every key no tuned config served is recorded in
    # FLYTUNE_ARTIFACT_DIR directories the file system refused to look up, with why: left out of
    # `artifact_dirs`, said once by whoever reads the sources (core.installed.artifact_dirs)
    refused_artifact_dirs: tuple[tuple[str, str], ...] = ()


def read(env=None) -> Settings:
    """Settings from `env` (default: `os.environ`)."""
    env = os.environ if env is None else env
    raw = env.get("FLYTUNE_AUTOTUNE", "").strip().lower()
    if raw not in AUTOTUNE_MODES:
        raise SettingsError(f"must be one of 0, 1, auto, search, off, strict, bundle (or unset), not {raw!r}",
                            field="FLYTUNE_AUTOTUNE")
    ranking = env.get("FLYTUNE_RANKING", "measured").strip() or "measured"
    if ranking not in RANKINGS:
        raise SettingsError(f"must be `measured` or `synthetic`, not {ranking!r}", field="FLYTUNE_RANKING")
    printing = env.get("FLYTUNE_PRINT_AUTOTUNING", "").strip()
    if printing not in ("", "0", "1"):
        raise SettingsError(f"must be 0 or 1, not {printing!r}", field="FLYTUNE_PRINT_AUTOTUNING")
    warmup = env.get("FLYTUNE_WARMUP", "").strip().lower() or "off"
    if warmup not in ("off", "0", "background"):
        raise SettingsError(f"must be `background` or `off` (or unset), not {env['FLYTUNE_WARMUP']!r}",
                            field="FLYTUNE_WARMUP")
    epoch = env.get("SOURCE_DATE_EPOCH", "").strip()
    dirs, refused = artifact_dirs(env.get("FLYTUNE_ARTIFACT_DIR", ""))
    packs = serving.packs_setting(env.get("FLYTUNE_PACKS", ""))
    if packs is None:
        raise SettingsError(f"must be `*` or comma-separated distribution names, not {env['FLYTUNE_PACKS']!r}",
                            field="FLYTUNE_PACKS")
    return Settings(
        autotune=AUTOTUNE_MODES[raw],
        ranking=ranking,
        print_autotuning=printing == "1",
        emit_dir=_path(env, "FLYTUNE_EMIT_DIR"),
        device=env.get("FLYTUNE_DEVICE") or None,
        interpret=env.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no"),
        artifact_dirs=dirs,
        refused_artifact_dirs=refused,
        cache_dir=_path(env, "FLYTUNE_CACHE_DIR"),
        flydsl_dir=env.get("FLYDSL_AUTOTUNE_CONFIG_DIR") or None,
        # a build is never refused over its timestamp: anything but digits means "no epoch given"
        source_date_epoch=int(epoch) if epoch.isascii() and epoch.isdigit() else None,
        ci=bool(env.get("CI")),
        visible_devices=tuple((v, env[v]) for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES") if v in env),
        packs=packs,
        warmup="off" if warmup == "0" else warmup,
        misses=_path(env, "FLYTUNE_MISSES"),
    )


def _path(env, name: str) -> Path | None:
    """The path a variable names (None: unset or empty); one of blanks only, or holding a NUL, is refused (it
    would name a file called " " in the working directory, or no file at all)."""
    value = env.get(name, "")
    if value and (not value.strip() or "\0" in value):
        raise SettingsError(f"must be a path (or unset), not {value!r}", field=name)
    return Path(value) if value else None


# what a directory that is simply not there answers (every reader says "not a directory" and goes on); any
# other error of the file system (a name too long for it, a parent the process may not search) would be
# raised by the next `Path.is_dir()` of the runtime or `inspect --installed`, from a kernel call
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF)


def artifact_dirs(value: str) -> tuple[tuple[Path, ...], tuple[tuple[str, str], ...]]:
    """(FLYTUNE_ARTIFACT_DIR's directories, those the file system refuses to look up (ENAMETOOLONG,
    EACCES on a parent) with why): a refused one is left out, so no reader meets the error."""
    out, refused = [], []
    for d in value.split(os.pathsep):
        if not d:
            continue
        try:
            os.stat(d)
        except OSError as e:
            if e.errno not in _ABSENT:
                refused.append((d, str(e.strerror or e)))
                continue
        except ValueError:  # a NUL byte: no path at all
            continue
        out.append(Path(d))
    return tuple(out), tuple(refused)


def triton_env(env=None) -> dict[str, str]:
    """The `TRITON_*` variables, sorted: what can change a compiled kernel when Triton cannot say."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith("TRITON_")}


_process: Settings | None = None
_settled = False  # read again at the process's first decision (`settle`); True once its listeners ran
_lock = threading.RLock()  # one thread settles (re-entrant: a listener that settles again cannot deadlock)
_listeners: list = []
_override: contextvars.ContextVar[Settings | None] = contextvars.ContextVar("flytune_settings", default=None)


def current() -> Settings:
    """The settings of this context: its innermost `override`, else the process's (read from the
    environment on first use)."""
    o = _override.get()
    if o is not None:
        return o
    return _process if _process is not None else _read_process()


def _read_process() -> Settings:
    global _process
    _process = read()
    return _process


def reload() -> Settings:
    """Read the environment again (after a test or a user changed it)."""
    global _process, _settled
    with _lock:
        _process, _settled = None, False
    return current()


def settle() -> bool:
    """Called when a key is first decided (a kernel's first call): settings read before it, while modules
    were imported and kernels defined or adopted, were provisional, so the environment is read again once,
    and what was set between `import mylib` and the first kernel call takes effect. Every later call keeps
    what this one read; a value this read refuses (a SettingsError) is refused by every decision after it
    until it is fixed, never dropped for what the import read. True (each `on_change` listener called)
    when the settings changed."""
    global _process, _settled
    if _settled:
        return False
    with _lock:
        if _settled:
            return False
        if _process is None:  # never read: `current()` reads it now
            _settled = True
            return False
        fresh = read()   # a value it refuses raises here, and again at every decision until it is fixed: an
        try:             # invalid setting is never dropped for the import's settings after one error
            if fresh == _process:
                return False
            _process = fresh
            for listener in list(_listeners):
                listener()
            return True
        finally:
            _settled = True  # last: a thread that sees it sees the settings read and the listeners run


def _forked() -> None:
    global _lock
    _lock = threading.RLock()  # a thread settling in the parent is not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def on_change(listener) -> None:
    """Call `listener()` when `settle` finds the settings changed (the runtime forgets what it derived
    from them: the detected device, the offline tier's sources, each kernel's offline index)."""
    _listeners.append(listener)


@contextlib.contextmanager
def override(**changes):
    """A context in which the named settings differ, for this context only (other threads keep theirs);
    the previous settings come back on exit."""
    settle()  # what an override changes stays changed inside it: the first decision re-reads nothing
    changed = dataclasses.replace(current(), **changes)
    token = _override.set(changed)
    try:
        yield changed
    finally:
        _override.reset(token)
