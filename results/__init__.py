"""trainmem.results: the evaluated-points table.

Schema, Parquet store and queries (the sweep issue). Imports engine only.
"""

from ._plot import HEATMAP_FORMATS, heatmap_format, write_heatmap
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
    "HEATMAP_FORMATS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "heatmap_format",
    "part_exists",
    "points_frame",
    "query_points",
    "read_metadata",
    "scan_points",
    "study_dir",
    "tool_version",
    "write_heatmap",
    "write_points",
]
