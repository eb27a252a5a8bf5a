"""`flytune import --format flydsl|vllm|sglang FILE...`: another tool's tuned configs as artifacts, all or
nothing (interop).
"""
from __future__ import annotations

import sys

from .output import EXIT_OK, EXIT_USAGE


def add_command(command) -> None:
    m = command("import", "turn another tool's tuned configs into flytune artifacts (all or nothing)",
                "0 imported, 1 a file or entry is refused (nothing is written), 2 usage error (DIR is, lies inside or "
                "holds a FILE)")
    m.add_argument("paths", nargs="+", metavar="FILE", help="config files in the chosen format")
    m.add_argument("--format", choices=("flydsl", "vllm", "sglang"), required=True,
                   help="flydsl: FlyDSL offline configs; vllm, sglang: fused-MoE config files "
                        "(E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]].json)")
    m.add_argument("--output", required=True, metavar="DIR",
                   help="artifact directory to write into (apart from every FILE)")
    m.add_argument("--kernel", "--name", dest="kernel", metavar="NAME",
                   help="kernel name to import under (required for vllm and sglang; flydsl default: the "
                        "FlyDSL name, '-' -> '_')")
    m.add_argument("--device", metavar="SPEC", help="device of every file, as FLYTUNE_DEVICE spells it "
                   "(cuda:sm_90:132:NVIDIA H200); vllm, sglang default: from the file name's device_name")


def command(args) -> int:
    from ..core import fsutil

    fsutil.apart(args.output, args.paths)  # `import fd/*.json --output fd`: artifacts among the files they came from
    if args.format == "flydsl":
        if args.device:
            print("flytune: error: --device applies to --format vllm and sglang (FlyDSL files name their "
                  "device)", file=sys.stderr)
            return EXIT_USAGE
        from ..interop.moe import save_all
        from ..interop import flydsl

        arts = [flydsl.from_flydsl(p, name=args.kernel) for p in args.paths]  # all or nothing
        written, there = save_all(arts, args.output)
        print(f"flytune: imported {written} FlyDSL config(s) into {args.output}"
              + (f" ({there} already there)" if there else ""))
        return EXIT_OK
    from ..core.artifact import KERNEL_NAME, KERNEL_NAME_MAX
    from ..core.device import parse_spec
    from ..interop import moe

    if not args.kernel or not KERNEL_NAME.fullmatch(args.kernel) or len(args.kernel) > KERNEL_NAME_MAX:
        print(f"flytune: error: --format {args.format} needs --kernel NAME, a dotted Python name of at most "
              f"{KERNEL_NAME_MAX} characters (the kernel's `name`, e.g. mylib.fused_moe)", file=sys.stderr)
        return EXIT_USAGE
    device = parse_spec(args.device, source="--device") if args.device else None
    arts = moe.import_files(args.paths, args.format, args.kernel, device)  # all or nothing
    written, there = moe.save_all(arts, args.output)
    print(f"flytune: imported {written} artifact(s) of {args.kernel} from {len(args.paths)} {args.format} "
          f"file(s) into {args.output}" + (f" ({there} already there)" if there else ""))
    return EXIT_OK
