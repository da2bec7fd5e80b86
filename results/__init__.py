"""trainmem.results: the evaluated-points table.

Schema, Parquet store and queries (the sweep issue). Imports engine only.

Each name is imported from its module when first used (they all need polars, which
`trainmem estimate` never loads).
"""

from typing import TYPE_CHECKING

from trainmem.engine._lazy import lazy_names, modules_of

if TYPE_CHECKING:  # pragma: no cover
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

_MODULES = {
    "._plot": ("HEATMAP_FORMATS", "heatmap_format", "write_heatmap"),
    "._query": ("query_points",),
    "._schema": ("SCHEMA", "SCHEMA_VERSION"),
    "._store": (
        "part_exists",
        "points_frame",
        "read_metadata",
        "scan_points",
        "study_dir",
        "tool_version",
        "write_points",
    ),
}
_MODULE_OF = modules_of(_MODULES)
"""Each public name and the module that defines it."""

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


__getattr__ = lazy_names(__name__, _MODULE_OF)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
