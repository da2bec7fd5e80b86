"""trainmem.results: the evaluated-points table

Schema, Parquet store and queries (the sweep issue). Imports engine only.
"""
