"""`flytune harvest ENTRY`: the arguments of `tuning.harvest.harvest`, and its account."""
from __future__ import annotations

from ..core import inductor
from ..core.errors import printable
from .output import EXIT_FAILED, EXIT_OK, dump


def add_command(command) -> None:
    h = command("harvest", "record a model's Inductor autotune winners (torch.compile, AOTInductor) on this GPU",
                "0 harvested, 1 the compile failed, autotuned no kernel (nothing written) or no GPU is visible "
                "(Inductor autotunes Triton kernels only on a CUDA or ROCm GPU), 2 usage error (a bad entry, or "
                "refused where CI is set)")
    h.add_argument("entry", metavar="ENTRY",
                   help="module:function returning (model, example_inputs), e.g. mylib.models:block")
    h.add_argument("--project", default=".", help="project root the entry is imported from, installed or not "
                                                  "(default: .)")
    h.add_argument("--mode", default="default", choices=inductor.MODES,
                   help="a torch.compile mode, or aoti for AOTInductor (default: default)")
    h.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True)")
    h.add_argument("--output", default="artifacts/{arch}",
                   help="artifact directory template: {arch}, {backend}, {device} (default: artifacts/{arch})")
    h.add_argument("--min-improvement", type=float, default=None, metavar="PCT",
                   help="a winner OUTPUT already holds stays unless beaten by more than PCT percent (default 3)")
    h.add_argument("--allow-ci", action="store_true", help="harvest even where CI is set")
    h.add_argument("--json", action="store_true", help="machine-readable output")


def command(args) -> int:
    from ..tuning.harvest import harvest

    extra = {} if args.min_improvement is None else {"min_improvement": args.min_improvement}
    got = harvest(args.entry, project=args.project, output=args.output, mode=args.mode, dynamic=args.dynamic,
                  allow_ci=args.allow_ci, **extra)
    # a harvest that wrote nothing is no success: a pipeline would ship an empty or stale directory
    status = EXIT_OK if got.artifacts else EXIT_FAILED
    if args.json:
        print(dump(got.to_json()))
        return status
    for art in got.artifacts:
        name = got.label(art)
        print(printable(f"  {name}: {art.config} ({got.outcomes.get(name, 'new')})"))
    for note in got.notes:
        print(printable(f"flytune: note: {note}"))
    choices = got.gemm_choices
    print(printable(f"flytune: harvested {len(got.artifacts) - choices} autotuned Inductor kernel(s)"
                    + (f" and {choices} GEMM template choice(s)" if choices else "")
                    + f" of {got.entry} ({got.mode}) on {got.device} in {got.seconds:.1f} s into {got.output}"))
    return status
