"""The ``matrix-run`` console script: imports the CLI (numpy, scipy, rich, jinja2: ~1-2 s) and runs
it, so that a Ctrl-C while those load exits 130 with one line instead of an import traceback
(new-user trial: ``timeout -s INT 2 matrix-run ...``).

A closed output pipe (``matrix-run ... | head -2``) ends no command: :class:`PipeGuard` sends what
is written after it to os.devnull, so the command finishes (a run writes its results) and exits with
its own code. Rich's answer, SystemExit(1) at the first write, was the "regression" code 1, and a
run stopped before the lines after its table (new-user trial)."""
from __future__ import annotations

import os
import sys


class PipeGuard:
    """``sys.stdout``/``sys.stderr`` whose reader may go away: a BrokenPipeError points its file
    descriptor at os.devnull (what is written after it is dropped) instead of raising."""

    def __init__(self, f):
        self._f = f

    def _closed_pipe(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._f.fileno())
        finally:
            os.close(null)

    def write(self, s: str) -> int:
        try:
            return self._f.write(s)
        except BrokenPipeError:
            self._closed_pipe()
            return len(s)

    def flush(self) -> None:
        try:
            self._f.flush()
        except BrokenPipeError:
            self._closed_pipe()
            try:  # the buffered rest now goes to devnull: nothing left for the exit's own flush
                self._f.flush()
            except OSError:
                pass

    def __getattr__(self, name):
        return getattr(self._f, name)


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted while starting: nothing was run", file=sys.stderr)
        return 130
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None:
        sys.stdout = PipeGuard(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = PipeGuard(sys.stderr)
    try:
        return cli_main(argv)
    finally:
        for f in (sys.stdout, sys.stderr):
            if isinstance(f, PipeGuard):
                f.flush()
        sys.stdout, sys.stderr = saved


if __name__ == "__main__":
    sys.exit(main())
