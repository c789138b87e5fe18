"""The ``matrix-run`` console script: imports the CLI (numpy, scipy, rich, jinja2: ~1-2 s) and runs
it, so that a Ctrl-C while those load exits 130 with one line instead of an import traceback
(new-user trial: ``timeout -s INT 2 matrix-run ...``)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted while starting: nothing was run", file=sys.stderr)
        return 130
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
