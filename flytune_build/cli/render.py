"""The text the commands print, from the data the engines return: `flytune inspect`, `inspect --installed`
and `diff` from the documents audit.inspection makes (the same documents `--json` prints); `verify` from an
audit.source.Source, `warmup` from a runtime.warming.warmup.Report, and `tune --repeat`'s stability table from
tuning.stability.Stability. The engines hold no text of their own. Every name quoted from data is made
printable."""
from __future__ import annotations

from ..core import table
from ..core.errors import printable


def render_inspect(info: dict) -> str:
    labels = [t["label"] for t in info["targets"]]
    rows = [["kernel", *labels, "key axes"]]
    rows += [[k, *(row[lab] for lab in labels), ", ".join(info["key_axes"][k])] for k, row in info["coverage"].items()]
    lines = [f"{printable(info['path'])} ({info['kind']}{', package ' + info['package'] if info['package'] else ''})",
             table.render(rows, align="<" + ">" * len(labels), indent="  ")]
    lines.append("  accepted match levels: " + "; ".join(f"{t['label']}: {', '.join(t['accept'])}"
                                                       for t in info["targets"]))
    tc = info["toolchain"]
    tuned = ", ".join(tc["tuned_with_triton"]) or "?"
    lines.append(printable(f"  toolchain: triton {tc['declared'] or '(any)'}; tuned with {tuned}"))
    lines.append(f"  {info['artifacts']} artifact(s), {info['bytes']} bytes")
    lines += [f"  error: {printable(e['message'])}" for e in info["errors"]]
    return "\n".join(lines)


def render_diff(d: dict) -> str:
    def key(x):
        return printable(f"{x['kernel']} {x['key']} on {x['device']}")

    lines = [f"+ {key(x)}" for x in d["added"]] + [f"- {key(x)}" for x in d["removed"]]
    for x in d["changed"]:
        m = "" if x["margin"] is None else \
            f" (old winner {abs(x['margin']) * 100:.1f}% {'slower' if x['margin'] >= 0 else 'faster'} in the new run)"
        lines.append(f"~ {key(x)}: {printable(x['old'])} -> {printable(x['new'])}{m}")
    lines.append(f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed, "
                 f"{d['unchanged']} unchanged")
    return "\n".join(lines)  # its errors are `flytune: error: ...` lines on stderr, as every command's


def render_installed(info: dict) -> str:
    rows = [["kernel", "owner", "source", "role", "keys served"]]
    for k in info["kernels"]:
        for i, s in enumerate(k["sources"] or [{"source": "-", "role": "-", "keys_served": 0}]):
            rows.append([k["kernel"] if i == 0 else "", (k["owner"] or "(none installed)") if i == 0 else "",
                         s["source"], s["role"], str(s["keys_served"])])
    lines = [printable(f"installed bundles on {info['device']}" + (
        f" (FLYTUNE_PACKS={','.join(info['packs_setting'])})" if info["packs_setting"] else ""))]
    rows = [[printable(cell) for cell in row] for row in rows]  # each cell: the table's own newlines stay
    lines.append(table.render(rows, align="<<<<>", indent="  ") if info["kernels"] else
                 "  no installed bundle holds any artifact")
    lines += [printable(f"  {k['kernel']}: {p}") for k in info["kernels"] for p in k["problems"]]
    return "\n".join(lines)


def render_verify(src) -> str:
    """One audit.source.Source: its verdict and counts, then each error and warning."""
    head = "ok" if src.ok else f"{len(src.errors)} violation(s)"
    lines = [f"{printable(src.path)} ({src.kind}): {head}; {len(src.artifacts)} artifact(s), "
             f"{len({a.kernel for a in src.artifacts})} kernel(s)"]
    lines += [f"  error: {printable(str(e))}" for e in src.errors]
    lines += [f"  warning: {printable(w)}" for w in src.warnings]
    return "\n".join(lines)


def render_warmup(report) -> str:
    """A runtime.warming.warmup.Report: one row per unit, its notes, then the counts."""
    rows = [("kernel", "config", "tuned keys", "status", "seconds", "here", "note")]
    for u in report.units:
        keys = ",".join(f"{k}={v}" for k, v in u.keys[0].items()) if u.keys else ""
        keys += f" (+{len(u.keys) - 1})" if len(u.keys) > 1 else ""
        keys += f" [{','.join(u.variant)} unaligned]" if u.variant else ""
        here = "ready" if u.loaded else "-"
        here += f", {u.primed} decided" if u.primed else ""
        rows.append((u.kernel, str(u.config), keys, u.status + (f" ({u.where})" if u.where else ""),
                     f"{u.seconds:.2f}", here, u.note))
    c = report.counts()
    lines = [table.render(rows, align="    >")] if report.units else []
    lines += [f"note: {n}" for n in report.notes]
    ready = sum(u.loaded for u in report.units)
    lines.append(f"flytune: warm-up for {report.target}: {c['compiled']} compiled, {c['cached']} already cached, "
                 f"{c['interpreter']} on the interpreter, {c['skipped']} skipped, {c['failed']} failed, "
                 f"{ready} ready in this process, {sum(u.primed for u in report.units)} tuned keys decided, "
                 f"in {report.seconds:.1f} s" + (f"; Triton cache: {report.cache_dir}" if report.cache_dir else ""))
    return "\n".join(lines)


def render_stability(rows) -> str:
    """`tune --repeat`'s table, from (kernel, shape, tuning.stability.Stability) rows: agreement, spread,
    and the other winners."""
    out = [("kernel", "shape", "agree", "spread", "other winners")]
    for kernel, shape, s in rows:
        spread = "-" if s.spread is None else f"{s.spread:.1%}"
        others = "; ".join(f"{c} x{n}" for c, n in s.others) or "-"
        out.append((kernel, shape, s.label, spread, others))
    unstable = sum(s.agreed < s.runs for _, _, s in rows)
    return table.render(out) + f"\nflytune: {unstable} of {len(rows)} shape(s) chose different winners across " \
                               f"repetitions"
