"""`trainmem trace --module TARGET`: trace any nn.Module a factory function builds.

TARGET is `package.module:factory` (imported) or `path/to/file.py:factory` (loaded from the
file, its folder importable while it loads). The factory is called inside the fake mode and on
the traced device, so its parameters and batch are fake tensors there: a 70B module costs no
memory. It takes no arguments, or keyword arguments among `seq_len` and `micro_batch_size`,
which trainmem passes (`--save-profile` traces two sequence lengths, so it needs `seq_len`).

It returns `(module, batch)` or `(module, batch, loss_fn)`:
- batch: a dict (called as module(**batch)), a tuple or list (module(*batch)) or one tensor
  (module(batch)). Under --precision bf16, its floating tensors are cast to bf16 with the
  parameters.
- the loss: loss_fn(output, batch) when given; else the output's `.loss` (Hugging Face outputs)
  or its "loss" item (a dict); else, for a tensor output (the first item of a tuple),
  output.float().mean() -- a stand-in whose own saved tensors are small; give a loss_fn to
  count a real loss's (a cross-entropy keeps its fp32 log-softmax for backward).
Activation checkpointing (--recompute full) uses the module's own
activation_checkpointing_enable / gradient_checkpointing_enable (Hugging Face) when it has one,
else checkpoints each repeated block (the largest nn.ModuleList of one class, with any
other list of that class, as T5's encoder and decoder blocks).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FACTORY_KWARGS = ("seq_len", "micro_batch_size")


def load_factory(target: str) -> Callable[..., Any]:
    """The factory function TARGET names (see the module docstring); one-line ValueErrors."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"module: expected MODULE:FACTORY or FILE.py:FACTORY, got '{target}'")
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ValueError(f"module: no such file '{module_name}'")
        spec = importlib.util.spec_from_file_location(f"_trainmem_trace_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"module: cannot load '{module_name}' as Python")
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            raise ValueError(
                f"module: importing '{module_name}' failed: {_one_line(exc)}"
            ) from None
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            mod = importlib.import_module(module_name)
        except Exception as exc:
            raise ValueError(f"module: cannot import '{module_name}': {_one_line(exc)}") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ValueError(f"module: '{module_name}' has no function '{attr}'")
    return factory


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def call_factory(factory: Callable[..., Any], *, seq_len: int, micro_batch_size: int) -> Any:
    """factory(**the keywords it takes among seq_len and micro_batch_size)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    values = {"seq_len": seq_len, "micro_batch_size": micro_batch_size}
    kwargs = {k: v for k, v in values.items() if takes_any or k in params}
    return factory(**kwargs)


def factory_takes_seq_len(factory: Callable[..., Any]) -> bool:
    """Whether the factory can build batches of a given sequence length."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "seq_len" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _loss_of(output: Any) -> Any:
    import torch

    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is not None:
        return loss
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise ValueError(
            f"module: the module returned {type(output).__name__}, not a tensor or an output "
            "with .loss; return a loss_fn(output, batch) as the factory's third item"
        )
    return output if output.dim() == 0 else output.float().mean()


def _call(model: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def module_job(
    factory: Callable[..., Any], *, seq_len: int, micro_batch_size: int, precision: str
) -> Callable[[], Any]:
    """A builder of the step for `factory` (see the module docstring)."""
    import torch
    from torch.utils._pytree import tree_map

    from ._step import StepJob

    def build() -> Any:
        made = call_factory(factory, seq_len=seq_len, micro_batch_size=micro_batch_size)
        if not isinstance(made, (tuple, list)) or len(made) not in (2, 3):
            raise ValueError(
                "module: the factory must return (nn.Module, batch) or (nn.Module, batch, "
                f"loss_fn); got {type(made).__name__}"
            )
        model, batch, *rest = made
        loss_fn = rest[0] if rest else None
        if not isinstance(model, torch.nn.Module):
            raise ValueError(
                f"module: the factory's first item must be an nn.Module, got {type(model).__name__}"
            )
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError("module: the factory's third item must be a loss_fn(output, batch)")
        if precision == "bf16":
            batch = tree_map(
                lambda t: (
                    t.to(torch.bfloat16)
                    if isinstance(t, torch.Tensor) and t.is_floating_point()
                    else t
                ),
                batch,
            )

        def loss(m: Any, b: Any) -> Any:
            output = _call(m, b)
            return loss_fn(output, b) if loss_fn is not None else _loss_of(output)

        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        supports = getattr(model, "supports_gradient_checkpointing", False)
        recompute = (lambda m: enable()) if enable is not None and supports else None
        return StepJob(model=model, batch=batch, loss=loss, enable_recompute=recompute)

    return build


def trace_module(
    target: str,
    *,
    seq_len: int,
    micro_batch_size: int,
    precision: str,
    recompute: str,
    optimizer: str,
    device: str = "cuda",
    sdpa_kernel: str = "flash",
    fake: bool = True,
    on_phase_end: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One measured step of the module TARGET's factory builds (keys as trace_step's; `fake` and
    `on_phase_end` as there)."""
    from ._core import check_flags, import_torch, in_child_if_needed

    import_torch()
    check_flags(precision=precision, recompute=recompute, optimizer=optimizer, device=device)
    factory = load_factory(target)
    flags: dict[str, Any] = {
        "seq_len": seq_len,
        "micro_batch_size": micro_batch_size,
        "precision": precision,
        "recompute": recompute,
        "optimizer": optimizer,
        "sdpa_kernel": sdpa_kernel,
    }
    if device == "cuda" and fake and on_phase_end is None:
        done = in_child_if_needed("trace_module", {"target": target, **flags})
        if done is not None:
            return done
    return _run_module_step(
        target, factory, device=device, fake=fake, on_phase_end=on_phase_end, **flags
    )


def _run_module_step(
    target: str,
    factory: Callable[..., Any],
    *,
    seq_len: int,
    micro_batch_size: int,
    precision: str,
    recompute: str,
    optimizer: str,
    sdpa_kernel: str,
    device: str,
    fake: bool,
    on_phase_end: Callable[[str], None] | None,
) -> dict[str, Any]:
    """trace_module in this process, its flags checked and `factory` loaded from `target`: the
    step's contexts on `device`, the measured step (a failure of the user's module as a one-line
    ValueError naming `target`, not a traceback), and where it ran."""
    from ._core import step_contexts, unpacked_batches
    from ._step import run_step

    device_type, contexts, note = step_contexts(device=device, fake=fake, sdpa_kernel=sdpa_kernel)
    build = module_job(
        factory, seq_len=seq_len, micro_batch_size=micro_batch_size, precision=precision
    )
    try:
        out = run_step(
            build,
            precision=precision,
            recompute=recompute,
            optimizer=optimizer,
            device_type=device_type,
            contexts=[*contexts, unpacked_batches()],
            on_phase_end=on_phase_end,
            full_warm_up=not fake,
        )
    except ValueError:
        raise
    except Exception as exc:  # the user's module failed: say where, in one line
        raise ValueError(
            f"module: the traced step of '{target}' failed: {_one_line(exc)}"
        ) from None
    out.update(
        device=f"{device_type} (fake)" if fake else device_type,
        note=note,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
    )
    return out
