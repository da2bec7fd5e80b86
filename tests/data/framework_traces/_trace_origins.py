"""Shared by the make_*_traces.py scripts (not run at test time): every new device storage of a
trace remembers the op that made it, and a step's saved tensors are listed by that op.

Importing this module patches trainmem.trace._step.Tracker once (the scripts' own tracing aid;
`trainmem trace` itself keeps no per-storage record).
"""

from __future__ import annotations

from torch.utils.weak import WeakIdKeyDictionary

import trainmem.trace._step as step

TRACKERS: list[step.Tracker] = []
"""Every Tracker that recorded a storage, in order: the last is the running step's."""
_plain_dispatch, _plain_add = step.Tracker.__torch_dispatch__, step.Tracker.add


def _dispatch(self, func, types_, args=(), kwargs=None):
    self.op = func
    return _plain_dispatch(self, func, types_, args, kwargs)


def _add(self, t, owner):
    before = self.sequence
    _plain_add(self, t, owner)
    if self.sequence != before:
        if not hasattr(self, "origins"):
            self.origins = WeakIdKeyDictionary()
            TRACKERS.append(self)
        self.origins[step.local_tensor(t).untyped_storage()] = (
            str(getattr(self, "op", "?")), list(t.shape), str(t.dtype).replace("torch.", ""))


step.Tracker.__torch_dispatch__, step.Tracker.add = _dispatch, _add


def saved_since(tracker: step.Tracker, start_sequence: int, owners=None) -> dict[str, list[str]]:
    """The storages made after `start_sequence` and still alive, per owner ("outside" or the
    block's index; only `owners` if given), sorted by owner, each in creation order as
    "op shape dtype bytes"."""
    saved: dict = {}
    for storage, (cell, seq, owner) in list(tracker.live.items()):
        if seq > start_sequence and (owners is None or owner in owners):
            op, shape, dtype = tracker.origins.get(storage, ("?", [], "?"))
            key = "outside" if owner == step.OUTSIDE else str(owner)
            op = op.removeprefix("aten.").removesuffix(".default")
            saved.setdefault(key, []).append((seq, f"{op} {shape} {dtype} {cell[0]}"))
    return {k: [text for _, text in sorted(v)] for k, v in sorted(saved.items())}
