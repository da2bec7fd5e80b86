"""trainmem.sweep: the command line (and, later, the configuration-space search)."""
