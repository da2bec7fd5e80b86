"""`trainmem check`: a training job's own config files, read and estimated.

The readers cover torchtune, axolotl, LLaMA-Factory, LitGPT, HF Trainer / TRL, accelerate,
DeepSpeed, torchtitan, Megatron and launch lines; every field keeps where it came from.
"""

from ._check import STACK_CHOICES, check_report, detect, read_job
from ._files import parse, read_files
from ._models import normalise, resolve_model
from ._reading import Doc, Read, Reading
from ._stacks import STACK_NAMES, Stack, stacks

__all__ = [
    "STACK_CHOICES",
    "STACK_NAMES",
    "Doc",
    "Read",
    "Reading",
    "Stack",
    "check_report",
    "detect",
    "normalise",
    "parse",
    "read_files",
    "read_job",
    "resolve_model",
    "stacks",
]
