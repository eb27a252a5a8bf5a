"""The `flytune` command: tune on the intended GPU; verify, inspect and diff bundles without one.

Exit codes: 0 clean, 1 violations (or a failed run), 2 usage error, 120 stdout closed early, 130
interrupted. Errors are one line `flytune: error: ...` on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from ..core.errors import FlytuneError, FlytuneWarning, UsageError, printable
from ..core.version import VERSION

from . import flags
from .output import EXIT_BROKEN_PIPE, EXIT_CODES, EXIT_INTERRUPTED, EXIT_USAGE, EXIT_VIOLATIONS


class _Parser(argparse.ArgumentParser):
    def add_argument(self, *args, **kwargs):
        """Every value a command takes as text (a path, a name, a spec) is refused empty (`flags.text`)."""
        action = super().add_argument(*args, **kwargs)
        if action.type is None and action.nargs != 0 and action.choices is None:
            action.type = flags.text
        return action

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"flytune: error: {printable(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flytune", description=__doc__.splitlines()[0], epilog=EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flytune {VERSION}",
                        help="print the flytune-build version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                help="`flytune COMMAND --help` describes each")

    def command(name, help, codes):
        return sub.add_parser(name, help=help, description=help, epilog=f"exit codes: {codes}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    from . import (bundle, diff, export, fmt, harvest, importing, init, inspection, merge, report, tune, upgrade,
                   verify, warmup)

    init.add_command(command)
    tune.add_command(command)
    for module in (verify, inspection, diff, fmt, export, importing, bundle):
        module.add_command(command)
    merge.add_command(command)
    warmup.add_command(command)
    report.add_command(command)
    upgrade.add_command(command)
    harvest.add_command(command)
    return parser


def main(argv=None) -> int:
    closed = text_streams()
    warning_lines()
    args = build_parser().parse_args(argv)
    try:
        code = _command(args.command).command(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return EXIT_BROKEN_PIPE if closed and code == 0 else code  # `>&-`: done, its output had nowhere to go
    except UsageError as e:  # the run cannot start as asked: nothing was done
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FlytuneError as e:
        print(f"flytune: error: {e}", file=sys.stderr)
        return EXIT_VIOLATIONS
    except KeyboardInterrupt:
        print("flytune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return broken_pipe()
    except OSError as e:  # a path the system refused (too long, a loop of links, no permission): named
        where = f"{printable(str(e.filename))}{f' -> {printable(str(e.filename2))}' if e.filename2 else ''}: " \
            if e.filename else ""
        print(f"flytune: error: {where}{e.strerror or printable(str(e))}", file=sys.stderr)
        return EXIT_VIOLATIONS
    except Exception as e:  # noqa: BLE001 - a bug or an OS error: one line, as every other failure
        print(f"flytune: error: {type(e).__name__}: {printable(str(e))}", file=sys.stderr)
        return EXIT_VIOLATIONS


def warning_lines() -> None:
    """A warning the runtime gives while a command runs (a FlytuneWarning) is printed as the command's own
    are, `flytune: warning: ...` on one line, not as Python shows a warning (a file, a line of code)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, FlytuneWarning):
            return shown(message, category, filename, lineno, file, line)
        text = printable(str(message))
        print(text if text.startswith("flytune: ") else f"flytune: warning: {text}", file=sys.stderr)
    show.flytune = True
    if not getattr(shown, "flytune", False):   # once per process (tests call main again)
        warnings.showwarning = show


def text_streams() -> bool:
    """stdout and stderr write what they cannot encode as Python escapes: a path is printed whatever its
    bytes (a file name that is no UTF-8 reaches Python as lone surrogates, which a strict UTF-8 stream
    refuses with UnicodeEncodeError), and what a command prints never fails for the text it holds.

    A stream closed from the start (`>&-`: Python makes it None) writes to os.devnull: what is printed
    there is dropped, and the work is done all the same, never an AttributeError after it. Returns
    whether stdout was closed so (exit 120, as for a reader gone)."""
    closed = sys.stdout is None
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - the process's own
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text stream of ours (an embedding replaced it)
            pass
    return closed


def broken_pipe() -> int:
    """Whoever read stdout stopped (`| head`): end quietly, and point stdout at /dev/null so the
    interpreter's own last flush has nothing to complain about (pip does the same)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _command(name: str):
    """The module of command `name` (one module per command); imported when that command runs."""
    from . import (bundle, diff, export, fmt, harvest, importing, init, inspection, merge, report, tune, upgrade,
                   verify, warmup)

    return {"init": init, "tune": tune, "verify": verify, "inspect": inspection, "diff": diff, "fmt": fmt,
            "export": export, "import": importing, "bundle": bundle, "merge": merge, "warmup": warmup,
            "report": report, "upgrade": upgrade, "harvest": harvest}[name]


if __name__ == "__main__":
    raise SystemExit(main())
