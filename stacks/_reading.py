"""What `trainmem check` read from a job's own config files: each field's value and where it
came from (a file's key, the stack's default, a flag, or trainmem's default), the keys that
change memory but are not modelled, and warnings.

A stack's reader (one module per stack, stacks/_STACK.py) fills one `Reading` from its `Doc`s:
`put` for a value a file gives, `default` for what the stack does when the file is silent
(citing the stack's file), `unmodelled` for a memory-relevant key trainmem cannot count. The
values are trainmem's: estimate's option names (model, gpu, num_gpus and the TrainingConfig
fields) in trainmem's vocabulary; estimate checks them, and a bad value's error names the file
key it came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Doc:
    """One input file: its name, its text and what it parses to."""

    name: str
    """The file's name as given (a path's base name on the command line, the key over HTTP)."""
    text: str
    data: Any
    """The parsed document: a mapping (YAML, JSON, TOML), or None for a shell script / a
    launch line (readers parse `text`)."""
    syntax: str
    """yaml | json | toml | shell."""


@dataclass(frozen=True, slots=True)
class Read:
    """One field's value and its origin: `"file:KEY"` (with `file` the file's name),
    `"stack-default:SOURCE"`, `"flag"` or `"trainmem-default"`."""

    value: Any
    origin: str
    file: str | None = None
    raw: Any = None
    """The file's own value at the key (YAML/JSON/TOML), where there is one: what `--fix`
    shows as the edit's old value."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "from": self.origin}
        if self.file is not None:
            out["file"] = self.file
        return out


@dataclass
class Reading:
    """Every field the files of one job gave, with its origin."""

    stack: str
    stack_version: str
    fields: dict[str, Read] = field(default_factory=dict)
    unmodelled: list[str] = field(default_factory=list)
    """`FILE:KEY` of each memory-relevant key trainmem does not model (said, never dropped)."""
    warnings: list[str] = field(default_factory=list)

    def put(self, name: str, value: Any, doc: Doc, key: str) -> None:
        """`name` = `value`, read from `doc`'s `key`. A field another file already gave keeps
        its first value (the job's main file is read first); a different value is a warning."""
        old = self.fields.get(name)
        if old is not None and old.origin.startswith("file:# ") and old.file != doc.name:
            # A usage comment (torchtune's `# tune run --nproc_per_node 8 ...`) is an example;
            # the job's own launch line says what it runs on.
            self.warnings.append(
                f"{name}: {doc.name}:{key} says {value!r} (over {old.file}'s comment, "
                f"{old.value!r})"
            )
        elif old is not None and old.origin.startswith("file:"):
            if old.value != value:
                self.warnings.append(
                    f"{name}: {doc.name}:{key} says {value!r}, {old.file}:"
                    f"{old.origin.removeprefix('file:')} says {old.value!r}; using {old.value!r}"
                )
            return
        raw = dig(doc.data, key) if isinstance(doc.data, Mapping) else None
        self.fields[name] = Read(value, f"file:{key}", doc.name, raw)

    def default(self, name: str, value: Any, source: str) -> None:
        """`name` = `value` as the stack does when its files leave it out (`source`: the
        stack's file that decides it, e.g. `torchtune/training/_distributed.py`)."""
        if name not in self.fields:
            self.fields[name] = Read(value, f"stack-default:{source}")

    def override(self, name: str, value: Any, origin: str, file: str | None = None) -> None:
        """`name` = `value` whatever was read before (a value derived from several keys)."""
        self.fields[name] = Read(value, origin, file)

    def get(self, name: str, default: Any = None) -> Any:
        read = self.fields.get(name)
        return default if read is None else read.value

    def has(self, name: str) -> bool:
        return name in self.fields

    def unmodelled_key(self, doc: Doc, key: str, why: str) -> None:
        """A key that changes memory and that trainmem does not model: warned with why, listed
        once (two readings of one key, a name guess and the JSON, say two reasons)."""
        if f"{doc.name}:{key}" not in self.unmodelled:
            self.unmodelled.append(f"{doc.name}:{key}")
        self.warnings.append(f"{doc.name}:{key}: not modelled ({why})")

    def warn(self, text: str) -> None:
        self.warnings.append(text)


# ---- values as trainmem wants them ------------------------------------------------------------


def bad(doc: Doc, key: str, what: str, value: Any) -> ValueError:
    """The one-line error of a bad value: `FILE: KEY: expected WHAT, got VALUE`."""
    return ValueError(f"{doc.name}: {key}: expected {what}, got {value!r}")


def as_int(doc: Doc, key: str, value: Any, *, ge: int = 0) -> int:
    """An integer key (`4`, `"4"`, `4.0`), at least `ge`."""
    if isinstance(value, bool):
        raise bad(doc, key, "an integer", value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise bad(doc, key, "an integer", value) from None
    if not math.isfinite(number) or number != int(number) or number < ge:
        raise bad(doc, key, f"an integer >= {ge}", value)
    return int(number)


def as_float(doc: Doc, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise bad(doc, key, "a number", value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise bad(doc, key, "a number", value) from None
    if not math.isfinite(number):
        raise bad(doc, key, "a finite number", value)
    return number


TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0", "none", "null", "")


def as_bool(doc: Doc, key: str, value: Any) -> bool:
    """A switch: YAML/JSON booleans, 0/1, and the strings true/false/yes/no/on/off."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise bad(doc, key, "true or false", value)


def is_auto(value: Any) -> bool:
    """DeepSpeed's / HF's "auto": filled in from elsewhere (not a value of this file)."""
    return isinstance(value, str) and value.strip().lower() == "auto"


def dig(data: Any, dotted: str) -> Any:
    """`data["a"]["b"]` for `"a.b"`; None when any level is missing or not a mapping."""
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return None
        data = data[part]
    return data


def has_key(data: Any, dotted: str) -> bool:
    head, _, last = dotted.rpartition(".")
    parent = dig(data, head) if head else data
    return isinstance(parent, Mapping) and last in parent
