"""`python -m trainmem.cli`: the `trainmem` command line."""

from trainmem.cli import run

run()
