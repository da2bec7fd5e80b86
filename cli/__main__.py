from trainmem.cli import run

run()
