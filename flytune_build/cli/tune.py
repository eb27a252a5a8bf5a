"""`flytune tune`: run a tuning plan on this device and write artifacts with full provenance.

Each plan entry names a setup `module:function`; `function(**shape)` builds inputs and returns the
call to tune. The call runs with search forced; each search's winner becomes an artifact. Finished
entries are recorded in `<output>/.flytune-tune-state`, so an interrupted plan resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import importlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core import codec, settings
from ..core.codec import Fields
from ..core.errors import FlytuneError, ProjectError
from ..core.fsutil import atomic_write
from ..core.project import Project, TuneEntry
from ..runtime import autotuner, device

STATE_FILE = ".flytune-tune-state"


@dataclass
class Result:
    kernel: str
    shape: dict
    key: dict | None
    winner: str
    time_ms: float
    margin: float | None     # runner-up time / winner time - 1
    status: str              # tuned | resumed | no-search


def _job_id(entry: TuneEntry, shape: dict, dev: str) -> str:
    return hashlib.sha256(codec.canonical([entry.kernel, entry.setup, shape, dev])).hexdigest()[:24]


def _load_setup(spec: str, file):
    module, _, func = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ProjectError(f"names {spec!r}, which cannot be loaded: {e}", file=file, field="setup") from None


def run(project: Project, entries: tuple[TuneEntry, ...], *, output: Path | None = None, resume: bool = True,
        progress: bool = True, ranking: str | None = None, out=sys.stderr) -> list[Result]:
    """Tune every (entry, shape) not finished by an earlier run; the process's settings, `sys.path` and
    hooks are as they were when it returns."""
    changes = {"autotune": "search", "emit_dir": None}
    if ranking:
        changes["ranking"] = ranking
    saved_path = list(sys.path)
    sys.path.insert(0, str(project.root))
    try:
        with settings.override(**changes):
            return _run(project, entries, output, resume, progress, out)
    finally:
        sys.path[:] = saved_path


def _run(project, entries, output, resume, progress, out) -> list[Result]:
    dev = device.current()
    out_dir = output or Path(str(project.tune_dir).format(arch=dev.arch, backend=dev.backend))
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / STATE_FILE
    done = _read_state(state_path) if resume else {}
    jobs = [(e, s) for e in entries for s in e.shapes]
    events: list[dict] = []
    autotuner._listeners.append(events.append)
    results: list[Result] = []
    bar = _bar(len(jobs), progress, out)
    try:
        for entry, shape in jobs:
            jid = _job_id(entry, shape, dev.spec())
            bar.set_description(f"{entry.kernel} {shape}"[:60])
            if jid in done:
                results.append(Result(entry.kernel, shape, None, done[jid]["winner"], done[jid]["time_ms"],
                                      done[jid].get("margin"), "resumed"))
                bar.update(1)
                continue
            call = _load_setup(entry.setup, project.root / "pyproject.toml")(**shape)
            events.clear()
            if entry.autotuner:  # a @triton.autotune kernel: capture what its own search picks
                from ..runtime.adapters.triton_autotune import recording

                with recording(_load_setup(entry.autotuner, project.root / "pyproject.toml"), entry.kernel) as got:
                    call()
                    _sync()
                events.extend(_captured(got))
            else:
                call()
                _sync()
            mine = [ev for ev in events if ev["kernel"] == entry.kernel]
            if not mine:
                results.append(Result(entry.kernel, shape, None, "-", math.nan, None, "no-search"))
                print(f"flytune: warning: {entry.kernel} {shape}: no search ran (the key was already tuned "
                      f"in this run, or the setup does not call this kernel)", file=out)
            for ev in mine:
                ev["artifact"].save(out_dir)
                ok = sorted(c.time_ms for c in ev["candidates"] if math.isfinite(c.time_ms))
                margin = ok[1] / ok[0] - 1 if len(ok) > 1 and ok[0] > 0 else None
                r = Result(entry.kernel, shape, dict(ev["artifact"].key), str(ev["winner"].config),
                           ev["winner"].time_ms, margin, "tuned")
                results.append(r)
                done[jid] = {"winner": r.winner, "time_ms": r.time_ms, "margin": margin}
            _write_state(state_path, done)
            bar.update(1)
    finally:
        bar.close()
        autotuner._listeners.remove(events.append)
    return results


def _captured(artifacts) -> list[dict]:
    from ..core.config import Config
    from ..runtime.bench import Candidate

    out = []
    for art in artifacts:
        cands = [Candidate(Config.from_json(c["config"], Fields("provenance", FlytuneError)),
                           c["time_ms"] if c["time_ms"] is not None else math.inf)
                 for c in art.provenance.get("candidates", [])]
        winner = next((c for c in cands if c.config == art.config), Candidate(art.config, math.nan))
        out.append({"kernel": art.kernel, "artifact": art, "candidates": cands, "winner": winner, "seconds": 0.0})
    return out


def _sync():
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()


def _read_state(path: Path) -> dict:
    try:
        doc = codec.loads(path.read_bytes(), file=path, error=FlytuneError)
        return doc["done"] if isinstance(doc, dict) and isinstance(doc.get("done"), dict) else {}
    except (OSError, FlytuneError):
        return {}


def _write_state(path: Path, done: dict) -> None:
    atomic_write(path, codec.canonical({"format": 1, "done": done}) + b"\n")


def _bar(total: int, enabled: bool, out):
    try:
        from tqdm import tqdm
    except ImportError:  # a dependency; an environment that removed it just gets no bar
        enabled = False
    if not enabled:
        class _Quiet:
            def update(self, n): pass
            def set_description(self, d): pass
            def close(self): pass
        return _Quiet()
    return tqdm(total=total, unit="shape", file=out, dynamic_ncols=True)


def summary(results: list[Result]) -> str:
    rows = [("kernel", "shape", "winner", "time (ms)", "margin", "status")]
    for r in results:
        t = "-" if math.isnan(r.time_ms) else f"{r.time_ms:.4f}"
        m = "-" if r.margin is None else f"+{r.margin * 100:.1f}%"
        shape = ",".join(f"{k}={v}" for k, v in r.shape.items())
        rows.append((r.kernel, shape, r.winner, t, m, r.status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
