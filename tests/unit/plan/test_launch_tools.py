"""Each launch format of `trainmem recommend`, read by the tool that runs it.

DeepSpeed's DeepSpeedConfig parses the JSON (batch arithmetic checked at the plan's data-parallel
world size); accelerate's config loader reads the FSDP YAML; torch's torchrun parser reads the
launch lines of the torchrun, slurm and torchtitan formats; `bash -n` reads the scripts; the
Megatron-LM flags are parsed with the argument types of Megatron-LM's arguments.py
(tests/data/megatron_args.json), mapped as core_transformer_config_from_args does, and built by
megatron-core (TransformerConfig, DDP and optimizer configs, a GPTModel on the meta device whose
parameter count is the plan's); torchtitan's ConfigManager parses the torchtitan line and its
ParallelDims checks the degrees. The plans: dense Llama 3.1 8B / 70B, GQA models with qkv bias
or tied embeddings, MoE (Mixtral, Qwen3), MLA (DeepSeek-V2-Lite), every ZeRO stage, offload,
recompute and tp/pp/cp/ep > 1 (searched plans and edited copies: render is a pure function of
the report).

A missing tool skips its tests, unless TRAINMEM_REQUIRE_LAUNCH_TOOLS is set (CI): then it is a
failure naming the install line (.ci/run).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainmem.catalog import model_config_dict
from trainmem.plan._launch import DEEPSPEED_OPTIMIZERS, TORCHTITAN_CONFIGS, render
from trainmem.plan._recommend import recommend_report

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
INSTALL = {
    "deepspeed": "DS_BUILD_OPS=0 pip install --no-build-isolation torch==2.13.0 deepspeed==0.19.8",
    "accelerate": "pip install torch==2.13.0 accelerate==1.15.0",
    "megatron": "pip install --no-deps megatron-core==0.16.1",
    "torchtitan": "pip install torch==2.13.0 tyro==1.0.17 torch_checkpointing==0.1.1 && "
    "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 torchdata==0.11.0 triton==3.9.0",
    "torch": "pip install torch==2.13.0",
}
"""How .ci/run installs each tool (CPU torch pinned; --no-deps where the dependencies would bring
another torch or the tools' run-time-only packages)."""


def _tool(module: str, key: str) -> Any:
    """Import a tool's module; skip when missing, fail under TRAINMEM_REQUIRE_LAUNCH_TOOLS."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if os.environ.get("TRAINMEM_REQUIRE_LAUNCH_TOOLS"):
            pytest.fail(f"{module} is not importable ({error}); install: {INSTALL[key]}")
        pytest.skip(f"{module} not installed ({INSTALL[key]})")


def _job(model: str, fleet: str, seq_len: int, gbs: int, framework: str) -> dict[str, Any]:
    return recommend_report(
        model=model, fleet=fleet, seq_len=seq_len, global_batch_size=gbs, framework=framework
    )


def _alternatives(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan and each alternative as a report of its own (what render takes)."""
    return [report, *({**report, **alt, "alternatives": []} for alt in report["alternatives"])]


MEGATRON_JOBS = [
    ("llama-3.1-8b", "8xh100-sxm-80gb", 4096, 256),
    ("llama-3.1-70b", "64xh100-sxm-80gb", 8192, 512),  # tp 2, pp 4, cp 4, interleaved
    ("llama-3.2-1b", "8xh100-sxm-80gb", 2048, 64),  # tied embeddings, rope factor 32
    ("qwen2.5-7b", "8xh100-sxm-80gb", 4096, 128),  # GQA 28/4, qkv bias
    ("mixtral-8x7b", "32xh100-sxm-80gb", 4096, 256),  # MoE, ep 2 among the alternatives
    ("qwen3-30b-a3b", "16xh100-sxm-80gb", 4096, 256),  # MoE with qk norm
    ("deepseek-v2-lite", "16xh100-sxm-80gb", 4096, 256),  # MLA, YaRN, shared experts
]


@pytest.fixture(scope="module")
def megatron_plans() -> list[dict[str, Any]]:
    plans = [p for job in MEGATRON_JOBS for p in _alternatives(_job(*job, "megatron"))]
    base = plans[0]
    multi = {"num_nodes": 4, "gpus_per_node": 8, "num_gpus": 32}
    return [
        *plans,
        {**base, **multi, "tp": 4, "pp": 4, "virtual_stages": 2, "dp": 2, "zero": 3,
         "recompute": "full", "offload": "optimizer", "precision": "fp8-mixed",
         "sequence_parallel": True},
        {**base, "zero": 1, "recompute": "selective", "optimizer": "sgd",
         "precision": "mixed-fp16"},
        {**base, "zero": 0, "recompute": "selective-layer", "pp": 2, "dp": 4,
         "precision": "fp32"},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def deepspeed_plans() -> list[dict[str, Any]]:
    plans = [
        *_alternatives(_job("llama-3.1-8b", "8xh100-sxm-80gb", 4096, 256, "deepspeed")),
        *_alternatives(_job("mistral-7b", "16xh100-sxm-80gb", 4096, 256, "deepspeed")),
        *_alternatives(_job("mixtral-8x7b", "16xh100-sxm-80gb", 4096, 256, "deepspeed")),
    ]
    base = plans[0]
    return [
        *plans,
        {**base, "zero": 3, "offload": "optimizer+params", "recompute": "full",
         "precision": "mixed-fp16"},
        {**base, "zero": 1, "offload": "optimizer", "optimizer": "sgd-momentum",
         "precision": "fp32"},
        {**base, "zero": 2, "offload": "optimizer", "optimizer": "adafactor"},
        {**base, "zero": 0, "optimizer": "adamw-8bit"},
        {**base, "zero": 3, "optimizer": "lion", "num_nodes": 2, "gpus_per_node": 8,
         "num_gpus": 16, "dp": 16, "grad_accum_steps": 16, "global_batch_size": 256},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def fsdp_plans() -> list[dict[str, Any]]:
    plans = [
        *_alternatives(_job("llama-3.1-8b", "8xh100-sxm-80gb", 4096, 256, "hf")),
        *_alternatives(_job("qwen2.5-7b", "16xh100-sxm-80gb", 4096, 256, "hf")),
    ]
    base = plans[0]
    return [
        *plans,
        {**base, "zero": 3, "offload": "optimizer+params", "recompute": "full",
         "compile": "blocks"},
        {**base, "zero": 0, "precision": "mixed-fp16"},
        {**base, "zero": 2, "num_nodes": 2, "gpus_per_node": 8, "num_gpus": 16, "dp": 16,
         "grad_accum_steps": 16, "precision": "fp32"},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def torchtitan_plans() -> list[dict[str, Any]]:
    plans = [
        *_alternatives(_job("llama-3.1-8b", "8xh100-sxm-80gb", 4096, 256, "torchtitan")),
        *_alternatives(_job("llama-3.1-70b", "64xh100-sxm-80gb", 8192, 512, "torchtitan")),
        *_alternatives(_job("qwen3-30b-a3b", "16xh100-sxm-80gb", 4096, 256, "torchtitan")),
        *_alternatives(_job("mistral-7b", "8xh100-sxm-80gb", 4096, 128, "torchtitan")),
    ]
    base = plans[0]
    return [
        *plans,
        {**base, "num_nodes": 1, "gpus_per_node": 8, "num_gpus": 8, "tp": 2, "pp": 1, "cp": 2,
         "dp": 2, "virtual_stages": 1, "zero": 3, "recompute": "full",
         "compile": "blocks+loss", "grad_accum_steps": 128, "sequence_parallel": False},
        {**base, "num_nodes": 1, "gpus_per_node": 8, "num_gpus": 8, "tp": 1, "pp": 1, "cp": 1,
         "dp": 8, "virtual_stages": 1, "zero": 0, "recompute": "selective-op",
         "precision": "fp32", "grad_accum_steps": 32},
    ]  # fmt: skip


# ---- DeepSpeed ---------------------------------------------------------------------------------


def test_deepspeed_parses_every_config(deepspeed_plans, tmp_path, monkeypatch) -> None:
    """deepspeed.runtime.config.DeepSpeedConfig reads the file (hjson, duplicate keys refused)
    at the plan's data-parallel world size (an mpu; DeepSpeed asserts train_batch_size =
    micro x accumulation x world size) and its parsed values are the plan's."""
    _tool("deepspeed", "deepspeed")
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # no process group
    for k, plan in enumerate(deepspeed_plans):
        path = tmp_path / f"ds{k}.json"
        path.write_text(render(plan, "deepspeed"))
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda dp=plan["dp"]: dp)
        cfg = ds_config.DeepSpeedConfig(str(path), mpu=mpu)
        assert cfg.world_size == plan["dp"]
        mb, accum = plan["micro_batch_size"], plan["grad_accum_steps"]
        assert cfg.train_batch_size == mb * accum * plan["dp"]
        assert cfg.train_micro_batch_size_per_gpu == plan["micro_batch_size"]
        assert cfg.gradient_accumulation_steps == plan["grad_accum_steps"]
        assert int(cfg.zero_optimization_stage) == plan["zero"]
        assert cfg.bfloat16_config.enabled == (plan["precision"] == "mixed-bf16")
        assert cfg.float16_config.enabled == (plan["precision"] == "mixed-fp16")
        zero = cfg.zero_config
        optimizer_offload = zero.offload_optimizer.device if zero.offload_optimizer else "none"
        param_offload = zero.offload_param.device if zero.offload_param else "none"
        assert optimizer_offload == ("cpu" if plan["offload"] != "none" else "none")
        assert param_offload == ("cpu" if plan["offload"] == "optimizer+params" else "none")
        h = plan["architecture"]["hidden_size"]
        if plan["zero"] >= 1:
            assert zero.reduce_bucket_size == h * h
        if plan["zero"] == 3:
            assert zero.prefetch_bucket_size == int(0.9 * h * h)
            assert zero.param_persistence_threshold == 10 * h
        block = DEEPSPEED_OPTIMIZERS.get(plan["optimizer"])
        if block:
            assert cfg.optimizer_name.lower() == block["type"].lower()
            # torch's AdamW (foreach) where the plan's optimizer is it; DeepSpeedCPUAdam under
            # offload (the host steps: no torch_adam written).
            torch_adam = plan["optimizer"] == "adamw" and plan["offload"] == "none"
            params = {k: v for k, v in block["params"].items() if k != "torch_adam"}
            assert cfg.optimizer_params == {
                **params,
                **({"torch_adam": True} if torch_adam else {}),
            }
        else:
            assert cfg.optimizer_name is None and cfg.zero_allow_untested_optimizer
        assert cfg.activation_checkpointing_config.partition_activations is False
        # the check is real: another world size is refused
        wrong = SimpleNamespace(get_data_parallel_world_size=lambda dp=plan["dp"]: dp + 1)
        with pytest.raises(AssertionError, match="train_batch_size"):
            ds_config.DeepSpeedConfig(str(path), mpu=wrong)


# ---- accelerate --------------------------------------------------------------------------------


def test_accelerate_loads_every_config(fsdp_plans, tmp_path) -> None:
    """accelerate's config loader (load_config_from_file -> ClusterConfig.from_yaml_file, which
    refuses unknown keys) reads the YAML with the plan's values."""
    _tool("accelerate", "accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    for k, plan in enumerate(fsdp_plans):
        path = tmp_path / f"a{k}.yaml"
        path.write_text(render(plan, "accelerate"))
        cfg = load_config_from_file(str(path))
        assert isinstance(cfg, ClusterConfig)
        assert cfg.distributed_type == DistributedType.FSDP
        assert cfg.num_processes == plan["num_gpus"] and cfg.num_machines == plan["num_nodes"]
        assert cfg.machine_rank == 0
        precision = {"mixed-bf16": "bf16", "mixed-fp16": "fp16", "fp32": "no"}[plan["precision"]]
        assert str(cfg.mixed_precision) == precision
        fsdp = cfg.fsdp_config
        zero = plan["zero"]
        assert fsdp["fsdp_version"] == (1 if zero == 0 else 2)
        sharding = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}[zero]
        assert fsdp["fsdp_sharding_strategy"] == sharding
        assert fsdp["fsdp_reshard_after_forward"] == (sharding if zero == 0 else zero == 3)
        assert fsdp["fsdp_offload_params"] == (plan["offload"] == "optimizer+params")
        assert fsdp["fsdp_activation_checkpointing"] == (plan["recompute"] == "full")
        assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        layer = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer"}
        wrap = layer[plan["architecture"]["model_type"]]
        assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == wrap
        compiled = plan.get("compile", "none") != "none"
        assert (str(cfg.dynamo_config.get("dynamo_backend", "NO")) == "INDUCTOR") == compiled
        if plan["num_nodes"] > 1:
            assert cfg.main_process_port == 29500


# ---- torchrun and slurm ------------------------------------------------------------------------


def _command(text: str, first: str) -> list[str]:
    """The tokens of the command starting with `first` (comments dropped, lines joined)."""
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if not ln.startswith("#")]
    (line,) = [ln for ln in lines if ln.startswith(first)]
    return shlex.split(line)


def _torchrun(tokens: list[str], plan: dict[str, Any], *, slurm: bool = False) -> list[str]:
    """torch.distributed.run's own parser on a torchrun line; returns the script's arguments."""
    run = _tool("torch.distributed.run", "torch")
    assert tokens[0] == "torchrun"
    args = run.get_args_parser().parse_args(tokens[1:])
    assert args.nnodes == ("$SLURM_NNODES" if slurm else str(plan["num_nodes"]))
    assert int(args.nproc_per_node) == plan["gpus_per_node"]
    assert args.rdzv_backend == "c10d"
    assert args.rdzv_endpoint == (
        "$MASTER_ADDR:$MASTER_PORT" if slurm else "${MASTER_ADDR:-localhost}:29500"
    )
    assert args.rdzv_id == ("$SLURM_JOB_ID" if slurm else plan["launch"]["job_name"])
    expected = {"megatron": "pretrain_gpt.py", "deepspeed": "train.py"}
    assert args.training_script == expected.get(plan["framework"], "torchtitan.train")
    assert args.module == (plan["framework"] == "torchtitan")
    return list(args.training_script_args)


def _bash_n(text: str) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the scripts"
    subprocess.run([bash, "-n"], input=text, text=True, check=True)


SBATCH = set(json.loads((DATA / "sbatch_options.json").read_text())["options"])


def test_torchrun_and_slurm_lines_parse(megatron_plans, deepspeed_plans) -> None:
    """torchrun's parser on the torchrun line and on the srun line of the sbatch script; bash -n
    on both; every #SBATCH option is one of sbatch's (tests/data/sbatch_options.json)."""
    for plan in [*megatron_plans, *deepspeed_plans]:
        if plan["framework"] == "megatron" and plan["optimizer"] not in ("adamw", "sgd"):
            continue
        text = render(plan, "torchrun")
        _bash_n(text)
        script = _torchrun(_command(text, "torchrun"), plan)
        assert script[-1] == "$EXTRA_ARGS"
        sbatch = render(plan, "slurm")
        _bash_n(sbatch)
        assert sbatch.startswith("#!/bin/bash\n")
        options = {}
        for line in sbatch.splitlines():
            if line.startswith("#SBATCH"):
                key, _, value = line.split()[1].partition("=")
                assert key in SBATCH, key
                options[key] = value
        assert options["--nodes"] == str(plan["num_nodes"])
        assert options["--gpus-per-node"] == str(plan["gpus_per_node"])
        assert options["--ntasks-per-node"] == "1"
        tokens = _command(sbatch, "srun")
        assert _torchrun(tokens[1:], plan, slurm=True) == script


# ---- Megatron ----------------------------------------------------------------------------------

MEGATRON = json.loads((DATA / "megatron_args.json").read_text())


def _megatron_parser() -> argparse.ArgumentParser:
    """The rendered flags with Megatron-LM's argument types (megatron/training/arguments.py, as
    tests/data/megatron_args.json records them); unknown flags are an error, as there."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    kinds = {"int": int, "float": float, "str": str}
    for flag, kind in MEGATRON["types"].items():
        dest = MEGATRON["dest"].get(flag, flag[2:].replace("-", "_"))
        choices = MEGATRON["choices"].get(flag)
        if kind == "switch":
            parser.add_argument(flag, dest=dest, action="store_true")
        elif kind == "pattern":  # moe_freq_type: an int or a list expression
            parser.add_argument(flag, dest=dest, type=_freq)
        else:
            parser.add_argument(flag, dest=dest, type=kinds[kind], choices=choices)
    for flag, dest in MEGATRON["store_false"].items():
        parser.add_argument(flag, dest=dest, action="store_false")
    return parser


def _freq(text: str) -> int | list[int]:
    if "[" not in text:
        return int(text)
    value = eval(compile(ast.parse(text, mode="eval"), "<freq>", "eval"), {"__builtins__": {}})
    return list(value)


def _megatron_namespace(plan: dict[str, Any]) -> argparse.Namespace:
    tokens = _command(render(plan, "torchrun"), "torchrun")
    args = tokens[tokens.index("pretrain_gpt.py") + 1 :]
    assert args[-1] == "$EXTRA_ARGS"
    return _megatron_parser().parse_args(args[:-1])


def _core_configs(ns: argparse.Namespace) -> tuple[Any, Any, Any]:
    """megatron-core's TransformerConfig (MLATransformerConfig under MLA), DDP config and optimizer
    config from the parsed flags, mapped as Megatron-LM's core_transformer_config_from_args does
    (fields taken by name; its renames: num_experts -> num_moe_experts, norm_epsilon ->
    layernorm_epsilon, swiglu -> gated_linear_unit + silu, num_query_groups only under
    --group-query-attention, virtual pipeline size from layers per virtual stage); their
    __post_init__ checks run."""
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if ns.multi_latent_attention else TransformerConfig
    values = vars(ns)
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in values.items() if k in names and v is not None}
    dtype = torch.bfloat16 if ns.bf16 else torch.float16 if ns.fp16 else torch.float32
    kw.update(
        num_moe_experts=ns.num_experts,
        layernorm_epsilon=ns.norm_epsilon,
        gated_linear_unit=ns.swiglu,
        activation_func=F.silu if ns.swiglu else F.gelu,
        bias_activation_fusion=False,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=True,
        perform_initialization=False,
        add_qkv_bias=ns.add_qkv_bias,
        gradient_accumulation_fusion=False,  # needs apex/TE kernels (a run-time choice)
        moe_grouped_gemm=False,  # the same parameters; grouped GEMM needs TE or grouped_gemm
    )
    if ns.num_layers_per_virtual_pipeline_stage:
        per_stage = ns.num_layers // ns.pipeline_model_parallel_size
        kw["virtual_pipeline_model_parallel_size"] = (
            per_stage // ns.num_layers_per_virtual_pipeline_stage
        )
    if ns.multi_latent_attention:  # Megatron-LM's --q-lora-rank default: None, no q LoRA
        kw.update(rope_type="yarn", rotary_base=ns.rotary_base, q_lora_rank=ns.q_lora_rank)
    if ns.fp8:
        kw.pop("fp8")  # Transformer Engine's recipe: checked by name and value below
    transformer = cls(**kw)
    ddp_names = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    ddp = DistributedDataParallelConfig(
        **{k: v for k, v in values.items() if k in ddp_names and v is not None}
    )
    opt_names = {f.name for f in dataclasses.fields(OptimizerConfig)}
    optimizer = OptimizerConfig(
        **{k: v for k, v in values.items() if k in opt_names and v is not None},
        params_dtype=dtype,
    )
    return transformer, ddp, optimizer


@pytest.fixture(scope="module")
def megatron_core():
    """megatron-core with a one-process gloo group (its layers ask parallel_state for sizes)."""
    _tool("megatron.core", "megatron")
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def _num_parameters(transformer: Any, ns: argparse.Namespace, plan: dict[str, Any]) -> int:
    """GPTModel (megatron-core's local spec) of the flags on the meta device, in one process
    (tp = pp = cp = ep = 1): its parameter count."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    single = dataclasses.replace(
        transformer,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        sequence_parallel=False,
        recompute_granularity=None,
        recompute_method=None,
        recompute_num_layers=None,
    )
    spec = get_gpt_decoder_block_spec(single, use_transformer_engine=False)
    vocab = -(-ns.vocab_size // (ns.make_vocab_size_divisible_by * ns.tensor_model_parallel_size))
    # MLA's YarnRotaryEmbedding asks torch.cuda.current_device() whatever
    # use_cpu_initialization says (multi_latent_attention.py): the CPU answers here.
    with pytest.MonkeyPatch.context() as patch, torch.device("meta"):
        patch.setattr(torch.cuda, "current_device", lambda: "cpu")
        model = GPTModel(
            config=single,
            transformer_layer_spec=spec,
            vocab_size=vocab * ns.make_vocab_size_divisible_by * ns.tensor_model_parallel_size,
            max_sequence_length=ns.max_position_embeddings,
            share_embeddings_and_output_weights=not ns.untie_embeddings_and_output_weights,
            position_embedding_type=ns.position_embedding_type,
            rotary_base=ns.rotary_base,
            rotary_percent=ns.rotary_percent or 1.0,
            rope_scaling=ns.use_rope_scaling,
            rope_scaling_factor=ns.rope_scaling_factor or 8.0,
        )
    return sum(p.numel() for p in model.parameters())


def _check_model_flags(ns: argparse.Namespace, transformer: Any, plan: dict[str, Any]) -> None:
    """Every model-defining flag, against the model's Hugging Face config."""
    m = plan["architecture"]
    hf = model_config_dict(plan["model"])
    assert transformer.num_layers == m["num_hidden_layers"] == hf["num_hidden_layers"]
    assert transformer.hidden_size == hf["hidden_size"]
    assert transformer.num_attention_heads == hf["num_attention_heads"]
    assert transformer.ffn_hidden_size == hf["intermediate_size"]
    kv = hf.get("num_key_value_heads", hf["num_attention_heads"])
    assert ns.group_query_attention == (kv != hf["num_attention_heads"])
    assert transformer.num_query_groups == kv
    assert transformer.gated_linear_unit and transformer.activation_func.__name__ == "silu"
    assert transformer.normalization == "RMSNorm"
    assert transformer.layernorm_epsilon == hf["rms_norm_eps"]
    assert ns.untie_embeddings_and_output_weights == (not hf.get("tie_word_embeddings", False))
    assert ns.vocab_size == hf["vocab_size"]
    assert ns.vocab_size % (ns.make_vocab_size_divisible_by * ns.tensor_model_parallel_size) == 0
    assert ns.seq_length == plan["seq_len"] <= ns.max_position_embeddings
    assert ns.max_position_embeddings >= hf["max_position_embeddings"]
    assert ns.position_embedding_type == "rope"
    assert ns.rotary_base == int(hf.get("rope_theta", 10000))
    assert transformer.add_bias_linear is False
    assert transformer.add_qkv_bias == hf.get("attention_bias", hf["model_type"] == "qwen2")
    assert transformer.qk_layernorm == (hf["model_type"] in ("qwen3", "qwen3_moe"))
    scaling = hf.get("rope_scaling") or {}
    llama3 = scaling.get("rope_type") == "llama3"
    assert ns.use_rope_scaling == llama3
    if llama3:
        assert ns.rope_scaling_factor == scaling["factor"]
    if scaling.get("type") == "yarn":
        assert transformer.rotary_scaling_factor == scaling["factor"]
        assert transformer.mscale == scaling["mscale"]
        assert transformer.mscale_all_dim == scaling["mscale_all_dim"]
        assert (
            transformer.original_max_position_embeddings
            == (scaling["original_max_position_embeddings"])
        )
        assert (transformer.beta_fast, transformer.beta_slow) == (
            scaling["beta_fast"],
            scaling["beta_slow"],
        )
        assert transformer.kv_lora_rank == hf["kv_lora_rank"]
        assert transformer.q_lora_rank == hf.get("q_lora_rank")
        assert transformer.qk_head_dim == hf["qk_nope_head_dim"]
        assert transformer.qk_pos_emb_head_dim == hf["qk_rope_head_dim"]
        assert transformer.v_head_dim == hf["v_head_dim"]
    experts = hf.get("num_local_experts", hf.get("num_experts", hf.get("n_routed_experts")))
    assert transformer.num_moe_experts == experts
    if experts:
        assert transformer.moe_router_topk == hf["num_experts_per_tok"]
        assert transformer.moe_ffn_hidden_size == hf.get(
            "moe_intermediate_size", hf["intermediate_size"]
        )
        dense = hf.get("first_k_dense_replace", 0)
        layers = hf["num_hidden_layers"]
        freq = transformer.moe_layer_freq
        assert (freq == 1 and not dense) or freq == [0] * dense + [1] * (layers - dense)
        shared = hf.get("n_shared_experts", 0) * hf.get("moe_intermediate_size", 0)
        assert (transformer.moe_shared_expert_intermediate_size or 0) == shared


def test_megatron_flags_build_megatron_core_models(
    megatron_plans, megatron_core, monkeypatch
) -> None:
    """The flags parse with Megatron-LM's types, megatron-core accepts the configs they make,
    the model-defining flags are the model's, and the GPTModel they build has the plan's
    parameter count (the vocabulary unpadded). OptimizerConfig asks Transformer Engine's version
    under --use-precision-aware-optimizer (TE, a CUDA package, is absent here): it answers
    >= 2.1, the version the CPU-offload optimizer needs."""
    from megatron.core.optimizer import optimizer_config

    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda *a, **k: True)
    counted: dict[tuple[Any, ...], int] = {}
    for plan in megatron_plans:
        ns = _megatron_namespace(plan)
        transformer, ddp, optimizer = _core_configs(ns)
        for flag, key in (
            ("tensor_model_parallel_size", "tp"),
            ("pipeline_model_parallel_size", "pp"),
            ("context_parallel_size", "cp"),
            ("micro_batch_size", "micro_batch_size"),
            ("global_batch_size", "global_batch_size"),
        ):
            assert getattr(ns, flag) == plan[key], flag
        assert (ns.expert_model_parallel_size or 1) == plan["ep"]
        assert transformer.sequence_parallel == (plan["tp"] > 1 and plan["sequence_parallel"])
        assert (transformer.virtual_pipeline_model_parallel_size or 1) == plan["virtual_stages"]
        recompute = {"none": None, "selective": "selective"}.get(plan["recompute"], "full")
        assert transformer.recompute_granularity == recompute
        if plan["recompute"] == "selective-layer":
            assert transformer.recompute_method == "block"
        assert ddp.use_distributed_optimizer == (plan["zero"] >= 1)
        sharding = {2: "optim_grads", 3: "optim_grads_params"}.get(plan["zero"])
        assert (ddp.data_parallel_sharding_strategy if ns.use_megatron_fsdp else None) == sharding
        assert optimizer.optimizer_cpu_offload == (plan["offload"] == "optimizer")
        assert optimizer.bf16 == (plan["precision"] in ("mixed-bf16", "fp8-mixed"))
        assert optimizer.fp16 == (plan["precision"] == "mixed-fp16")
        assert (ns.fp8 == "hybrid") == (plan["precision"] == "fp8-mixed")
        _check_model_flags(ns, transformer, plan)
        key = (plan["model"], ns.tensor_model_parallel_size)
        # MLA builds with Transformer Engine's attention only (megatron-core 0.16.1's local
        # DotProductAttention takes no k_channels): its config is checked, not its model
        if key not in counted and not ns.multi_latent_attention:
            counted[key] = _num_parameters(transformer, ns, plan)
            assert counted[key] == plan["num_parameters"], plan["model"]


def test_megatron_rope_is_the_models(megatron_core) -> None:
    """megatron-core's RotaryEmbedding of the rendered --rotary-base / --use-rope-scaling /
    --rope-scaling-factor has the inverse frequencies transformers computes for the model."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    transformers = _tool("transformers", "torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for model in ("llama-3.1-8b", "llama-3.2-1b", "mistral-7b", "qwen2.5-7b"):
        plan = _job(model, "8xh100-sxm-80gb", 2048, 64, "megatron")
        ns = _megatron_namespace(plan)
        ours = RotaryEmbedding(
            kv_channels=plan["architecture"]["head_dim"],
            rotary_percent=ns.rotary_percent or 1.0,
            rotary_base=ns.rotary_base,
            rope_scaling=ns.use_rope_scaling,
            rope_scaling_factor=ns.rope_scaling_factor or 8.0,
            use_cpu_initialization=True,
        ).inv_freq
        hf = model_config_dict(model)
        config = transformers.AutoConfig.for_model(
            **{k: v for k, v in hf.items() if not k.startswith("_")}
        )
        kind = (config.rope_parameters or {}).get("rope_type", "default")
        if kind == "default":
            base = config.rope_parameters["rope_theta"]
            dim = plan["architecture"]["head_dim"]
            theirs = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        else:
            theirs, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-5, atol=0)


# ---- torchtitan --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchtitan_manager():
    """torchtitan's ConfigManager. Its model modules import `datasets` and
    torch.utils.tensorboard at module level, used only when a data loader or a metrics writer
    is built (not by the parse); when those packages are missing they stand in as empty
    modules while torchtitan is imported (sys.modules restored after)."""
    _tool("tyro", "torchtitan")
    stand_ins: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("datasets") is None:
        datasets = types.ModuleType("datasets")
        datasets.Dataset = type("Dataset", (), {})  # type: ignore[attr-defined]
        datasets.load_dataset = lambda *a, **k: None  # type: ignore[attr-defined]
        distributed = types.ModuleType("datasets.distributed")
        distributed.split_dataset_by_node = lambda *a, **k: None  # type: ignore[attr-defined]
        stand_ins |= {"datasets": datasets, "datasets.distributed": distributed}
    try:
        importlib.import_module("torch.utils.tensorboard")
    except ImportError:
        board = types.ModuleType("torch.utils.tensorboard")
        board.SummaryWriter = type("SummaryWriter", (), {})  # type: ignore[attr-defined]
        stand_ins["torch.utils.tensorboard"] = board
    with pytest.MonkeyPatch.context() as patch:
        for name, module in stand_ins.items():
            patch.setitem(sys.modules, name, module)
        config = _tool("torchtitan.config", "torchtitan")
        for module, _ in set(TORCHTITAN_CONFIGS.values()):
            _tool(f"torchtitan.models.{module}.config_registry", "torchtitan")
        _tool("torchtitan.models.llama3.config_registry", "torchtitan")
    return config.ConfigManager


def _parse_torchtitan(manager: Any, plan: dict[str, Any]) -> tuple[Any, list[str]]:
    text = render(plan, "torchtitan")
    _bash_n(text)
    args = _torchrun(_command(text, "torchrun"), plan)
    assert args[-2:] == ["$EXTRA_ARGS", args[-1]] and args[-1].startswith("activation-checkpoint:")
    args = [a for a in args if a != "$EXTRA_ARGS"]
    if plan["model"] not in TORCHTITAN_CONFIGS:  # the user's config function: the overrides
        assert "not a torchtitan 0.3.0 model" in text  # are checked over llama3's debug model
        assert args[:4] == ["--module", "${TORCHTITAN_MODULE:?your config_registry module}",
                            "--config", "${TORCHTITAN_CONFIG:?its function}"]  # fmt: skip
        args[1], args[3] = "llama3", "llama3_debugmodel"
    return manager().parse_args(args), args


def test_torchtitan_config_manager_parses_every_line(torchtitan_plans, torchtitan_manager) -> None:
    """torchtitan 0.3.0's ConfigManager (--module/--config, tyro over Trainer.Config, its
    __post_init__ checks) parses the line; the values are the plan's, ParallelDims accepts the
    degrees at the plan's world size, and the config's model has the plan's parameters."""
    import torch
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    counted = set()
    for plan in torchtitan_plans:
        cfg, args = _parse_torchtitan(torchtitan_manager, plan)
        p, t = cfg.parallelism, cfg.training
        dp = plan["dp"]
        assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (
            (dp, 1) if plan["zero"] == 0 else (1, dp)
        )
        assert p.tensor_parallel_degree == plan["tp"]
        assert p.pipeline_parallel_degree == plan["pp"]
        assert p.context_parallel_degree == plan["cp"]
        assert p.expert_parallel_degree == plan["ep"]
        if plan["tp"] > 1:
            assert p.enable_sequence_parallel == plan["sequence_parallel"]
        mb, accum = plan["micro_batch_size"], plan["grad_accum_steps"]
        assert t.global_batch_size == mb * accum * dp
        if plan["pp"] > 1:
            assert t.local_batch_size == mb * accum
            assert p.pipeline_parallel_microbatch_size == mb
            assert t.disable_cuda_graphs
            schedule = "Interleaved1F1B" if plan["virtual_stages"] > 1 else "1F1B"
            assert p.pipeline_parallel_schedule == schedule
        else:
            assert t.local_batch_size == mb
            assert t.global_batch_size // (t.local_batch_size * dp) == accum
        assert t.seq_len == plan["seq_len"]
        precision = {"mixed-bf16": "bfloat16", "fp32": "float32"}[plan["precision"]]
        assert t.mixed_precision_param == precision
        compile_ = plan.get("compile", "none")
        assert cfg.compile.enable == (compile_ != "none")
        if compile_ != "none":
            components = {"blocks": ["model"], "blocks+loss": ["model", "loss"]}[compile_]
            assert cfg.compile.components == components
        ac = {"none": type(None), "full": FullAC.Config}.get(plan["recompute"], SelectiveAC.Config)
        assert isinstance(cfg.activation_checkpoint, ac) or (
            plan["recompute"] == "none" and cfg.activation_checkpoint is None
        )
        dims = ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            world_size=plan["num_gpus"],
        )
        assert dims.world_size == plan["num_gpus"]
        if plan["model"] in TORCHTITAN_CONFIGS and plan["model"] not in counted:
            counted.add(plan["model"])
            assert args[:4] == ["--module", *TORCHTITAN_CONFIGS[plan["model"]][:1], "--config",
                                TORCHTITAN_CONFIGS[plan["model"]][1]]  # fmt: skip
            with torch.device("meta"):
                model = cfg.model_spec.model.build()
            assert sum(q.numel() for q in model.parameters()) == plan["num_parameters"]


def test_torchtitan_refuses_what_it_cannot_launch(torchtitan_plans) -> None:
    plan = torchtitan_plans[0]
    for change, field in (
        ({"zero": 2}, "zero"),
        ({"precision": "fp8-mixed"}, "precision"),
        ({"recompute": "selective-layer"}, "recompute"),
    ):
        with pytest.raises(ValueError, match=field):
            render({**plan, **change}, "torchtitan")
