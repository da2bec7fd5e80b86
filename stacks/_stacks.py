"""The stacks `trainmem check` reads, each a `Stack` in its own module (stacks/_NAME.py): how to
tell its files, the version whose defaults it applies, and its reader.

A job is one main file (a torchtune recipe, an axolotl / LLaMA-Factory / LitGPT / HF / torchtitan
config, a Megatron launch script) with, optionally, auxiliary files: a DeepSpeed JSON, an
accelerate config, a launch line (torchrun, sbatch, deepspeed, accelerate launch). Auxiliary
files are read after the main one and fill what it left out; alone, a DeepSpeed JSON or an
accelerate config is the job's main file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ._reading import Doc, Reading


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """One stack's reader."""

    name: str
    """The `--stack` value (and the JSON's `stack`)."""
    version: str
    """The stack release whose defaults the reader applies (the JSON's `stack_version`)."""
    framework: str
    """trainmem's `--framework` for a job of this stack (a reader may say otherwise, e.g. an HF
    Trainer config with a DeepSpeed file is `deepspeed`)."""
    detect: Callable[[Doc], int]
    """How sure it is that a file is this stack's: 0 not at all, higher wins (about 10 for a
    key only this stack uses)."""
    read: Callable[[Doc, Reading], None]
    """Fill the reading from one file (values, the stack's defaults, unmodelled keys)."""
    auxiliary: bool = False
    """Read after the main file, filling what it leaves (DeepSpeed, accelerate, launch lines)."""
    selectable: bool = True
    """Offered as `--stack NAME` (launch lines are always told apart by their shape)."""
    mapping_only: bool = False
    """Its files are mappings of keys (YAML, JSON, TOML): a file that parses as anything else (a
    script, plain text, an empty file), given to it by `--stack NAME`, is refused naming the file
    before the reader sees it (`read_job`)."""


STACK_MODULES = (
    "torchtune",
    "axolotl",
    "llamafactory",
    "litgpt",
    "hf",
    "accelerate",
    "deepspeed",
    "torchtitan",
    "megatron",
    "verl",
    "launch",
)
"""One module per stack, in the order ties in detection go."""
STACK_NAMES = tuple(m for m in STACK_MODULES if m != "launch")
"""`--stack` values (with `auto`)."""
AUXILIARY_ORDER = ("deepspeed", "accelerate", "launch")
"""Auxiliary files are read in this order after the main file."""


def stacks() -> dict[str, Stack]:
    """Every stack's reader by name (imported on first use)."""
    if not _STACKS:
        for name in STACK_MODULES:
            module = importlib.import_module(f"._{name}", __package__)
            stack: Stack = module.STACK
            if stack.name != name:
                raise RuntimeError(f"stacks/_{name}.py declares stack {stack.name!r}")
            _STACKS[name] = stack
    return _STACKS


_STACKS: dict[str, Stack] = {}
