"""`trainmem trace --save-profile FILE`: per-layer activation coefficients from two traced sizes.

Two steps of the same module and micro-batch at two sequence lengths (s and 2s by default) give,
per term, two equations b (per_token s + per_token_sq s^2) = bytes, solved by the engine's
derive_profile (engine/_profile.py, which owns the profile format); autocast's cached weight
copies, which do not grow with the batch, are measured apart and become the `constant` terms.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path
from typing import Any

from trainmem.hardware._files import check_path_name, shown_path

END_OF_BACKWARD_GRADIENT_FRACTION = 0.5
"""A backward peak with at least this fraction of the gradients alive is at the end of backward
(layer 0's recompute and gradients), below it at the start (the loss's and the head's)."""


def parse_seq_lens(text: str | None, seq_len: int) -> tuple[int, int]:
    """--profile-seq-lens A,B (default: seq_len and 2 x seq_len)."""
    if not text:
        return seq_len, 2 * seq_len
    parts = [p.strip() for p in text.split(",")]
    try:
        lens = tuple(int(p) for p in parts)
    except ValueError:
        lens = ()
    if len(lens) != 2 or min(lens) < 1 or lens[0] == lens[1]:
        raise ValueError(
            f"profile-seq-lens: expected two different positive integers A,B, got '{text}'"
        )
    return lens[0], lens[1]


def _derive_input(trace: dict[str, Any]) -> dict[str, Any]:
    """A trace as derive_profile reads it (it takes the trace's own keys, autocast weight copies
    counted apart), except for the gradients at the peak: derive_profile reads any as "the peak
    is at the end of backward"; a backward peak with less than half the gradients made is at its
    start (the loss's gradients), and the few made so far stay in the transient."""
    out = dict(trace)
    made = trace.get("gradients_at_peak_bytes", 0) / max(trace.get("gradients_bytes", 0), 1)
    if made < END_OF_BACKWARD_GRADIENT_FRACTION:
        out["gradients_at_peak_bytes"] = 0
    return out


def profile_from_traces(
    trace_a: dict[str, Any],
    trace_b: dict[str, Any],
    *,
    name: str,
    command: str,
    valid_for: dict[str, str],
) -> dict[str, Any]:
    """The profile JSON (engine/_profile.py format) from two traces of different lengths."""
    import torch

    from trainmem.engine import derive_profile, validate_profile

    if not trace_a["num_layers"]:
        raise ValueError(
            "save-profile: the module has no repeated blocks (an nn.ModuleList of one class); "
            "a profile is per layer"
        )
    profile = derive_profile(
        _derive_input(trace_a),
        _derive_input(trace_b),
        name=name,
        source={
            "command": command,
            "torch": torch.__version__,
            "created": datetime.date.today().isoformat(),
        },
        valid_for=valid_for,
    )
    if trace_a.get("hidden_size"):
        profile["hidden_size"] = int(trace_a["hidden_size"])
    validate_profile(profile)
    return profile


def check_save_profile(path: str | None) -> None:
    """ValueError (one line, "save-profile: ...") when the profile could not be written: a name
    too long, a folder, a missing or unwritable folder to hold it (tried by creating and
    removing a file there: permissions, a read-only file system, root's rights all count)."""
    if not path:
        return
    check_path_name(path, what="save-profile")
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"save-profile: {shown_path(path)} is a folder, not a file")
    folder = target.parent
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"save-profile: the folder {shown_path(folder)} {what}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".trainmem-probe-", dir=folder)
    except OSError as exc:
        raise ValueError(
            f"save-profile: cannot write in {shown_path(folder)}: {exc.strerror}"
        ) from None
    os.close(fd)
    os.unlink(probe)


def write_atomic(path: str, text: str) -> None:
    """`text` into `path` through a temporary file beside it, fsynced and renamed into place:
    a reader never sees half a profile (report/_overhead_file.py write_text_atomically, the
    one atomic text writer; a failure is one line naming save-profile)."""
    from trainmem.report._overhead_file import write_text_atomically

    write_text_atomically(path, text, what="save-profile")
