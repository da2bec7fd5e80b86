"""Accuracy per framework: traced steps of the frameworks' own code and published real-GPU peaks.

Traced (tests/data/framework_traces/): torchtitan 0.3.0's own Llama 3, AC policies and FSDP2 on
the fake CUDA device; the metric is the allocated peak, exact ground truth.
Measured (tests/data/published/framework_cases.json): peaks the frameworks' authors published,
with the metric each source reports (reserved, or torchtune's active bytes, compared with the
allocated peak); cases that use a knob trainmem does not model yet are listed apart.

`python -m bench.accuracy --frameworks` prints the tables; tests/test_readme.py checks that the
README and docs/accuracy.md show what this module produces.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
GIB = 2**30
README_BEGIN, README_END = "<!-- framework-accuracy:begin -->", "<!-- framework-accuracy:end -->"
DOCS_BEGIN, DOCS_END = "<!-- framework-cases:begin -->", "<!-- framework-cases:end -->"
MODES_BEGIN, MODES_END = "<!-- framework-modes:begin -->", "<!-- framework-modes:end -->"
"""docs/techniques.md: what each --framework mode assumes (engine/_frameworks.py)."""
TRACE_POLICY = {
    "none": "none",
    "full": "full",
    "selective_op": "selective",  # torchtitan's `selective` is per-op SAC
    "selective_layer_2": "selective-layer",
}
"""The traces' AC policy names -> --recompute."""
TRACED_LOSS = "full"
"""torchtitan_llama3_ac.json, _8b_fsdp.json and _compile.json ran torchtitan's CrossEntropyLoss on
the whole logits (the 2024-12 benchmark era's loss; 0.3's registry default, ChunkedLossWrapper,
is `--loss auto`: torchtitan_trainer_defaults.json)."""
TUNE_DIMS = {
    "hidden": 512,
    "intermediate": 1536,
    "heads": 8,
    "kv_heads": 2,
    "layers": 4,
    "vocab": 2048,
}
"""The traced torchtune llama3_2 (tied embeddings): framework_traces/torchtune_lora.json."""


def small_llama_spec(dims: dict[str, int], *, tied: bool = False) -> Any:
    """A traced toy Llama from its dimensions (the traces' `dims`)."""
    from trainmem.engine._model_readers import model_from_hf_config

    return model_from_hf_config(
        {
            "model_type": "llama",
            "hidden_size": dims["hidden"],
            "intermediate_size": dims["intermediate"],
            "num_attention_heads": dims["heads"],
            "num_key_value_heads": dims["kv_heads"],
            "num_hidden_layers": dims["layers"],
            "vocab_size": dims["vocab"],
            "tie_word_embeddings": tied,
        },
        name="llama-small",
    )


def estimate_one(spec: Any, **fields: Any) -> dict[str, float]:
    """The engine's columns for one configuration (engine.estimate_one), as floats."""
    from trainmem.engine import estimate_one as engine_one

    return {k: float(v) for k, v in engine_one(spec, fields).items()}


def estimate_torchtitan_ac(case: dict[str, Any]) -> dict[str, float]:
    """A torchtitan_llama3_ac.json case (small Llama 3, one rank, bf16, layer AC every 2nd)."""
    return estimate_one(
        small_llama_spec(case["dims"]),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision="bf16",
        framework="torchtitan",
        loss=TRACED_LOSS,
        recompute=TRACE_POLICY[case["policy"]],
        recompute_every=2,
        optimizer=case["optimizer"],
    )


def estimate_torchtitan_fsdp(case: dict[str, Any]) -> dict[str, float]:
    """A torchtitan_llama3_8b_fsdp.json case (Llama-3.1-8B, FSDP2, fused AdamW)."""
    from trainmem.catalog import load_model

    return estimate_one(
        load_model("llama-3.1-8b"),
        num_gpus=case["fsdp_world_size"],
        zero=3,
        micro_batch_size=case["local_batch_size"],
        seq_len=case["seq_len"],
        framework="torchtitan",
        loss=TRACED_LOSS,
        precision="mixed-bf16",
        recompute=TRACE_POLICY[case["policy"]],
        optimizer="adamw-fused",
    )


def estimate_megatron(case: dict[str, Any]) -> dict[str, float]:
    """A megatron_gpt_local.json case (megatron-core GPTModel, distributed optimizer); the traced
    model as a config.json (GPT-2 layout: LayerNorm, biases, GeLU, learned positions, tied
    embeddings: 14,183,424 parameters, as megatron-core built it)."""
    from trainmem.engine._model_readers import model_from_hf_config

    config = DATA / "framework_traces" / "megatron_gpt_local_config.json"
    return estimate_one(
        model_from_hf_config(json.loads(config.read_text()), name=config.stem),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        num_gpus=case["world_size"],
        tp=case["tp"],
        precision="mixed-bf16",
        framework="megatron",
        zero=1,
        # make_megatron_traces.py built TransformerConfig(masked_softmax_fusion=False) (its
        # default in megatron-core; no apex kernels on the fake device): the torch softmax
        # path, fp32. `eager` is Megatron-LM's default, the fused 16-bit kernel.
        attention="eager-unfused",
        recompute=case["recompute"],
        optimizer="adamw",
    )


def estimate_torchtune(case: dict[str, Any]) -> dict[str, float]:
    """A torchtune_lora.json case (lora_llama3_2, rank 16 on attention and MLP, bf16)."""
    return estimate_one(
        small_llama_spec(TUNE_DIMS, tied=True),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision="bf16",
        framework="torchtune",
        lora_rank=16,
        lora_targets="q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        recompute="full" if case["ac"] else "none",
        loss="chunked-output" if case["loss"] == "chunked" else "full",
        optimizer=case["optimizer"],
        activation_offload=case["offload"],
    )


def estimate_hf_qlora(case: dict[str, Any]) -> dict[str, float]:
    """An hf_qlora.json case (small Llama, bitsandbytes NF4 base + peft rank-16 all-linear
    adapters on a k-bit-prepared model, AdamW); an hf_qlora_old_bnb.json one (its
    bnb_saves_input) with `--bitsandbytes-version legacy`."""
    return estimate_one(
        small_llama_spec(case["dims"]),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision=case["precision"],
        framework="hf",
        lora_rank=case["lora"]["r"],
        lora_targets=case["lora"]["target_modules"],
        qlora=True,
        recompute=case["recompute"],
        optimizer=case["optimizer"],
        bitsandbytes_version="legacy" if case.get("bnb_saves_input") else "current",
    )


LITGPT_TARGETS = {
    "lora_query": "q_proj",
    "lora_key": "k_proj",
    "lora_value": "v_proj",
    "lora_projection": "o_proj",
    "lora_mlp": "gate_proj,up_proj,down_proj",
}
"""LitGPT's per-module LoRA switches (finetune/lora.py setup) -> trainmem's targets (LLaMAMLP
fc_1 = gate, fc_2 = up, proj = down)."""


def estimate_litgpt(
    case: dict[str, Any], *, framework: str = "litgpt", bitsandbytes_version: str = "current"
) -> dict[str, float]:
    """A litgpt_lora.json case (a small Llama in litgpt.lora.GPT, rank 16, bf16-true); a
    litgpt_qlora.json case (it records quant_state_bytes) with --qlora."""
    targets = ",".join(LITGPT_TARGETS[k] for k, on in case["targets"].items() if on)
    return estimate_one(
        small_llama_spec(case["dims"]),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision=case.get("precision", "bf16"),
        framework=framework,
        lora_rank=case["lora_rank"],
        lora_targets=targets,
        recompute="full" if case["ac"] else "none",
        optimizer=case["optimizer"],
        qlora="quant_state_bytes" in case,
        bitsandbytes_version=bitsandbytes_version,
    )


def estimate_litgpt_full(case: dict[str, Any]) -> dict[str, float]:
    """A litgpt_full.json case (LitGPT's full fine-tune of the small Llama, bf16-true, AdamW)."""
    return estimate_one(
        small_llama_spec(case["dims"]),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision="bf16",
        framework="litgpt",
        recompute="full" if case["ac"] else "none",
        optimizer=case["optimizer"],
    )


def traced_rows() -> list[dict[str, Any]]:
    """Per traced case (the CUDA build's behaviour): the activations and allocated-peak errors."""
    folder = DATA / "framework_traces"
    out = []
    small = json.loads((folder / "torchtitan_llama3_ac.json").read_text())["cases"]
    # A GPU's build: fused RMSNorm and silu_backward's own kernel (fake mode decomposes it; the
    # rows that keep the decomposition are the engine's calibration, not what a GPU runs).
    for c in (c for c in small if c["rms_norm"] == "fused" and c["silu"] == "fused"):
        name = f"llama3 small, {c['policy']}, {c['micro_batch_size']}x{c['seq_len']}"
        out.append(_traced(name, c, estimate_torchtitan_ac(c)))
    for c in json.loads((folder / "megatron_gpt_local.json").read_text())["cases"]:
        shape = f"{c['micro_batch_size']}x{c['seq_len']}"
        name = f"megatron-core GPT, {c['recompute']}, tp {c['tp']}, {shape}"
        out.append({**_traced(name, c, estimate_megatron(c)), "framework": "megatron"})
    for c in json.loads((folder / "torchtune_lora.json").read_text())["cases"]:
        name = f"llama3_2 small LoRA r16, AC {'on' if c['ac'] else 'off'}, {c['loss']} CE" + (
            ", activation offload" if c["offload"] else ""
        )
        out.append({**_traced(name, c, estimate_torchtune(c)), "framework": "torchtune"})
    for file in ("hf_qlora.json", "hf_qlora_old_bnb.json"):
        for c in json.loads((folder / file).read_text())["cases"]:
            if c.get("bnb_saves_input") and c["recompute"] == "full":
                # transformers 5's non-reentrant checkpoint with legacy bitsandbytes: a mix the
                # engine does not model (legacy is paired with its era's reentrant checkpoint;
                # docs/techniques.md, tests/golden/test_framework_traces.py)
                continue
            shape = f"{c['micro_batch_size']}x{c['seq_len']}"
            name = f"llama small QLoRA (bnb NF4 + peft r16), {c['precision']}, {c['recompute']}, "
            name += shape + (", bitsandbytes legacy" if c.get("bnb_saves_input") else "")
            out.append({**_traced(name, c, estimate_hf_qlora(c)), "framework": "hf"})
    for c in json.loads((folder / "litgpt_lora.json").read_text())["cases"]:
        shape = f"{c['micro_batch_size']}x{c['seq_len']}"
        adapted = "+".join(k.removeprefix("lora_") for k, on in c["targets"].items() if on)
        name = (
            f"llama small LoRA r{c['lora_rank']} ({adapted}), {c['precision']}, "
            f"AC {'on' if c['ac'] else 'off'}, dropout {c['lora_dropout']}, {shape}"
        )
        out.append(
            {**_traced(name, c, _with_held_logits(c, estimate_litgpt(c))), "framework": "litgpt"}
        )
    for c in json.loads((folder / "litgpt_qlora.json").read_text())["cases"]:
        adapted = "+".join(k.removeprefix("lora_") for k, on in c["targets"].items() if on)
        name = f"llama small QLoRA bnb.nf4 r{c['lora_rank']} ({adapted}), bf16, AC off"
        # bitsandbytes <= 0.43.1's MatMul4Bit (keeps its input): `--bitsandbytes-version legacy`
        bnb = "legacy" if c["bnb_saves_input"] else "current"
        if c["bnb_saves_input"]:
            name += ", bitsandbytes legacy"
        got = _with_held_logits(c, estimate_litgpt(c, bitsandbytes_version=bnb))
        out.append({**_traced(name, c, got), "framework": "litgpt"})
    for c in json.loads((folder / "litgpt_full.json").read_text())["cases"]:
        name = (
            f"llama small full fine-tune (finetune/full.py), vocab {c['dims']['vocab']}, "
            f"AC {'on' if c['ac'] else 'off'}, {c['micro_batch_size']}x{c['seq_len']}"
        )
        got = _with_held_logits(c, estimate_litgpt_full(c))
        out.append({**_traced(name, c, got), "framework": "litgpt"})
    big = json.loads((folder / "torchtitan_llama3_8b_fsdp.json").read_text())["cases"]
    for c in (c for c in big if c["silu_backward"] == "fused"):
        name = (
            f"llama-3.1-8b FSDP {c['fsdp_world_size']}, {c['policy']}, "
            f"{c['local_batch_size']}x{c['seq_len']}"
        )
        out.append(_traced(name, c, estimate_torchtitan_fsdp(c)))
    return out


def _with_held_logits(c: dict[str, Any], got: dict[str, float]) -> dict[str, float]:
    """A LitGPT estimate with fit's fp32 logits (Fabric's convert_output) added to the
    activations: the trace counts them there, the engine apart (LoRA's chunk list alive in every
    phase, engine/_loss.py LOOP_HELD_LOGITS; full.py's whole logits the loss's input, then
    loop_held_step_logits_bytes)."""
    held = 4.0 * c["tokens"] * c["dims"]["vocab"]
    return {**got, "activations_total": got["activations_total"] + held}


def _traced(name: str, case: dict[str, Any], got: dict[str, float]) -> dict[str, Any]:
    return {
        "framework": "torchtitan",
        "case": name,
        "activations_err": got["activations_total"] / case["activations_bytes"] - 1.0,
        "peak_err": got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0,
    }


METRIC_KEYS = {
    "reserved": "peak_reserved_bytes",
    "device": "peak_device_bytes",
    "fit": "peak_device_bytes",
}
"""A published case's metric -> the estimate's column (allocated and active: the allocated peak).
reserved: torch.cuda max_memory_reserved; device: what nvidia-smi / NVML shows for the process
(the CUDA context and the caching allocator's reserve); fit: the source says only whether it ran
(or went out of memory)."""


def _resolved(flags: dict[str, Any]) -> dict[str, Any]:
    """A case's flags, a `model` given as a config.json under published/ (models/NAME.json: a
    model no preset covers, with its source) as its path."""
    model = flags.get("model", "")
    if model.endswith(".json"):
        return {**flags, "model": str(DATA / "published" / model)}
    return flags


def measured_rows() -> list[dict[str, Any]]:
    """Per published case: the measured and predicted GiB in the source's metric, the error,
    and whether the fit call is right (the job ran, so it must fit its GPU)."""
    from trainmem import estimate

    cases = json.loads((DATA / "published" / "framework_cases.json").read_text())["cases"]
    out = []
    for c in cases:
        report = estimate(gpu=c["gpu"], headroom=0.0, **_resolved(c["flags"]))
        key = METRIC_KEYS.get(c["metric"], "peak_allocated_bytes")
        predicted = report[key] / GIB
        measured = c.get("measured_gib")
        ran = c.get("outcome", "ran") == "ran"
        out.append(
            {
                "framework": c["flags"]["framework"],
                "case": c["id"],
                "gpu": c["gpu"],
                "metric": c["metric"] if measured else f"fit ({c['outcome']})",
                "trust": c["trust"],
                "modelled": c["modelled"],
                "not_modelled": c.get("not_modelled", ""),
                "measured_gib": measured,
                "predicted_gib": predicted,
                "err": predicted / measured - 1.0 if measured else None,
                "fit_right": bool(report["fits"]) == ran,
            }
        )
    return out


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def summary_markdown() -> str:
    """Per framework: traced cases and their worst errors; modelled published cases, their
    median and worst error and fit calls; cases with unmodelled knobs counted apart."""
    traced, measured = traced_rows(), measured_rows()
    lines = [
        "| framework | traced cases (allocated) | worst activations / peak error "
        "| published cases (modelled) | median / worst error | fit / OOM calls right "
        "| published with knobs not modelled |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for fw in sorted({r["framework"] for r in traced + measured}):
        t = [r for r in traced if r["framework"] == fw]
        m = [r for r in measured if r["framework"] == fw and r["modelled"]]
        other = [r for r in measured if r["framework"] == fw and not r["modelled"]]
        worst_act = max((abs(r["activations_err"]) for r in t), default=0.0)
        worst_peak = max((abs(r["peak_err"]) for r in t), default=0.0)
        worst_t = f"{worst_act:.2%} / {worst_peak:.2%}" if t else "-"
        errs = [abs(r["err"]) for r in m if r["err"] is not None]
        worst_m = f"{statistics.median(errs):.1%} / {max(errs):.1%}" if errs else "-"
        fits = f"{sum(r['fit_right'] for r in m)}/{len(m)}" if m else "-"
        knobs = sorted({k.strip() for r in other for k in r["not_modelled"].split(",")})
        extra = f"{len(other)} ({', '.join(knobs)}; see docs/accuracy.md)" if other else "-"
        lines.append(f"| {fw} | {len(t)} | {worst_t} | {len(m)} | {worst_m} | {fits} | {extra} |")
    return "\n".join(lines)


def cases_markdown() -> str:
    """Every traced and published case with its error (docs/accuracy.md)."""
    lines = [
        "| framework | traced case | activations error | peak allocated error |",
        "|---|---|---:|---:|",
    ]
    for r in traced_rows():
        errors = f"{r['activations_err']:+.2%} | {r['peak_err']:+.2%}"
        lines.append(f"| {r['framework']} | {r['case']} | {errors} |")
    lines += [
        "",
        "| framework | published case | GPU | metric | trust | measured GiB | predicted GiB "
        "| error | fits | not modelled |",
        "|---|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in measured_rows():
        lines.append(
            f"| {r['framework']} | {r['case']} | {r['gpu']} | {r['metric']} | {r['trust']} "
            f"| {_gib(r['measured_gib'])} | {r['predicted_gib']:.2f} | {_pct(r['err'])} "
            f"| {'yes' if r['fit_right'] else 'no'} | {r['not_modelled'] or '-'} |"
        )
    return "\n".join(lines)


def modes_markdown() -> str:
    """What each `--framework` mode assumes, from its FrameworkSpec (docs/techniques.md)."""
    from trainmem.engine._frameworks import FRAMEWORK_SPECS

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    lines = [
        "| framework | `selective` means | vocab-parallel loss under TP | ZeRO-3 is FSDP2 "
        "| LoRA adapters in the model dtype | fused RMSNorm | one qkv projection "
        "| fp8 weight cache | fp32 logits from the model | FSDP2 embedding unit "
        "| extra fp32 [T, v/tp] of the parallel loss | QLoRA on a k-bit-prepared model "
        "| head chunk of its own loss (positions) | LoRA dropout on | `--loss auto` means "
        "| RoPE cache per block | follows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, spec in FRAMEWORK_SPECS.items():
        lines.append(
            f"| {name} | {spec.selective} | {yes(spec.loss_parallel)} | {yes(spec.fsdp2)} "
            f"| {yes(spec.adapters_in_param_dtype)} | {yes(spec.fused_rms_norm)} "
            f"| {yes(spec.fused_qkv)} | {yes(spec.fp8_weight_cache)} "
            f"| {yes(spec.logits_upcast_in_model)} "
            f"| {yes(spec.fsdp2_embedding_unit)} | {spec.loss_parallel_fp32_tensors:g} "
            f"| {yes(spec.qlora_kbit_prepared)} "
            f"| {spec.head_chunk_tokens or '-'} | {yes(spec.lora_dropout)} "
            f"| {spec.loss} | {yes(spec.rope_cache_per_block)} "
            f"| {spec.source} |"
        )
    return "\n".join(lines)
