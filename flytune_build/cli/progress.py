"""A tuning run's progress (a `tuning.Reporter`): one tqdm bar on a terminal (jobs done and failed, what
each worker is doing, the ETA), one plain line per finished job elsewhere (a log, CI, a pipe). Notes
always print."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, *, enabled: bool = True, out=sys.stderr):
        self.out, self.total, self.count, self.failed = out, 0, 0, 0
        self.enabled = enabled
        self.activity: dict[str, str] = {}
        self.bar = None

    def start(self, total: int, finished: int) -> None:
        self.total, self.count = total, finished
        if self.enabled and _isatty(self.out):
            try:
                from tqdm import tqdm
            except ImportError:  # a dependency; an environment that removed it gets plain lines
                pass
            else:
                self.bar = tqdm(total=total, initial=finished, unit="job", file=self.out, dynamic_ncols=True,
                                desc="flytune tune")

    def working(self, worker: str, what: str | None) -> None:
        """`worker` now runs `what` (None: idle)."""
        if what is None:
            self.activity.pop(worker, None)
        else:
            self.activity[worker] = what
        self._postfix()

    def finished(self, line: str, *, failed: bool = False) -> None:
        """One job ended (tuned, resumed or failed): `line` says how, and on which worker."""
        self.count += 1
        self.failed += failed
        if self.bar is not None:
            self.bar.update(1)
            self._postfix()
        elif self.enabled:
            print(f"flytune: [{self.count}/{self.total}] {line}", file=self.out, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def _postfix(self) -> None:
        if self.bar is not None:
            busy = " | ".join(f"{w}: {what}" for w, what in sorted(self.activity.items()))
            self.bar.set_postfix_str(f"failed={self.failed}" + (f" | {busy}" if busy else ""), refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _isatty(out) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
