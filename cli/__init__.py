"""trainmem.cli: the `trainmem` command line (typer).

`main(argv)` runs a command and returns its exit code (bad input: one line on stderr, 2);
`run()` is the console script.
"""

from ._app import app, main, run

__all__ = ["app", "main", "run"]
