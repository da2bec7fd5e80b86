"""trainmem.trace: one real training step on fake tensors (the `trace` extra: torch).

`trace_report` runs a step of a Hugging Face model (or any nn.Module factory) on a fake CUDA
device and compares what it measured with the estimate. torch is imported only when a trace runs.
"""

from ._report import trace_report, trace_text

__all__ = ["trace_report", "trace_text"]
