"""trainmem.results: the evaluated-points table

Schema, Parquet store and queries (the sweep issue). Imports engine only.
"""

from ._query import query_points
from ._schema import SCHEMA, SCHEMA_VERSION
from ._store import (
    part_exists,
    points_frame,
    read_metadata,
    scan_points,
    study_dir,
    tool_version,
    write_points,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "part_exists",
    "points_frame",
    "query_points",
    "read_metadata",
    "scan_points",
    "study_dir",
    "tool_version",
    "write_points",
]
