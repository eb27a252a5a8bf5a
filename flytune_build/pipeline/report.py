"""The one report every build prints: coverage, counts, toolchain."""
from __future__ import annotations

from collections import Counter

from ..core import table
from .state import BuildState


def print_report(state: BuildState, out) -> None:
    proj = state.project
    cells = Counter((a.kernel, i) for a in state.artifacts for i, t in enumerate(proj.targets) if t.covers(a.device))
    kernels = sorted({a.kernel for a in state.artifacts}
                     | (set(proj.coverage) if isinstance(proj.coverage, tuple) else set()))
    labels = [t.label() for t in proj.targets]
    rejected = sum(state.where(e) == "artifacts" for e in state.rejected)   # artifacts; the rest are declared
    declared = len(state.rejected) - rejected
    rows = [["kernel", *labels]] + [[k, *(cells[(k, i)] for i in range(len(labels)))] for k in kernels]
    lines = [f"flytune: bundle for {proj.package}: {len(kernels)} kernel(s) x {len(labels)} target(s)",
             table.render(rows, align="<" + ">" * len(labels), indent="  "),
             f"  kept {len(state.artifacts)}, excluded {len(state.excluded)} (other devices), "
             f"rejected {rejected}" + (f"; {declared} problem(s) in the declaration or the tuning plan"
                                       if declared else "")]
    for path, dev in state.excluded:
        lines.append(f"  excluded {path} (tuned on {dev}, no declared target covers it)")
    tuned = sorted({(a.provenance or {}).get("triton") for a in state.artifacts} - {None})
    lines.append(f"  toolchain: triton {proj.triton or '(any)'}; tuned with triton {', '.join(tuned) or '(unknown)'}")
    for w in state.warnings:
        lines.append(f"  warning: {w}")
    print("\n".join(lines), file=out, flush=True)
