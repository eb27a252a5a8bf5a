"""The text of `flytune inspect`, `inspect --installed` and `diff`, from the documents audit.inspection
makes (the same documents `--json` prints). Every name quoted from data is made printable."""
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
    lines += [f"error: {printable(e['message'])}" for e in d["errors"]]
    return "\n".join(lines)


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
