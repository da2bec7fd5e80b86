"""trainmem.results: the evaluated-points table (schema, Parquet store, queries). Imports engine only."""
