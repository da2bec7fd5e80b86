"""Regenerate llama_recipes_fsdp1.json: one rank's traced memory of llama-recipes' FSDP1
fine-tune of mid-2023 (meta-llama/llama-recipes llama_finetuning.py), on trainmem's fake CUDA
device and a fake process group of 4.

Pinned: torch 2.13.0+cpu, transformers 5.24.0, peft 0.x of the venv. Not run at test time.
One case per process (a fake process group per process):

    python tests/data/framework_traces/make_llama_recipes_traces.py CASE  # -> /tmp/lrw/CASE.json
    python tests/data/framework_traces/make_llama_recipes_traces.py --merge

What llama-recipes did, reproduced (meta-llama/llama-recipes e5970e2e, 2023-07-25, PR #41, and
597e6342, 2023-08-05; llama_finetuning.py main): LlamaForCausalLM.from_pretrained(model_name)
(no torch_dtype: an fp32 model), `model.to(torch.bfloat16)` when fsdp_config.pure_bf16, peft's
get_peft_model for --use_peft, then FSDP(model, auto_wrap_policy=..., mixed_precision=None when
pure_bf16 else get_policies' policy, sharding_strategy=FULL_SHARD, device_id=current device,
limit_all_gathers=True) with torch's defaults otherwise (use_orig_params=False, backward_prefetch
BACKWARD_PRE, forward_prefetch False), then policies.apply_fsdp_checkpointing (checkpoint_wrapper
NO_REENTRANT on every LlamaDecoderLayer; fsdp_activation_checkpointing defaults True). Wrap
policy: the full fine-tune transformer_auto_wrap_policy({LlamaDecoderLayer})
(policies/wrapping.py get_llama_wrapper); with peft utils/fsdp_utils.py fsdp_auto_wrap_policy:
_or_policy of a lambda policy (every leaf module with a trainable weight: each lora_A / lora_B
linear its own unit) and the transformer policy. Optimizer torch.optim.AdamW (weight_decay 0,
foreach on CUDA). Attention eager (transformers 4.31 LlamaAttention: scores in the model dtype,
softmax upcast to fp32, cast back). Cases: "full" pure bf16 (the full fine-tune of issue #100),
"lora" pure bf16 LoRA r 8 on q_proj, v_proj (PR #41's test plan), "mixed" the full fine-tune
without --pure_bf16 (configs/fsdp.py pure_bf16 False from a977145a, 2023-07-25, and
get_policies' bfSixteen_mixed: param_dtype fp32, reduce_dtype bf16, buffer_dtype bf16: the
parameters stay fp32 in compute).

What departs from 2023: transformers 5.24's loss (ForCausalLMLoss: one fp32 upcast of the
logits, labels shifted, no shifted logits copy) where 4.31's LlamaForCausalLM upcast the logits
and copied the shifted logits (`logits[..., :-1, :].contiguous()`); torch 2.13's FSDP1 runtime for
torch 2.0.1 / 2.1 nightlies (the same FlatParamHandle unshard / reshard, post-backward
reduce-scatter and rate limiter); peft's current adapters (fp32, see trace/_lora.py) where peft of
July 2023 kept them as nn.Linear's default dtype too. The fake device runs FSDP1's streams and
events in program order (make_fsdp1_traces.py's docstring): no record_stream delay.
"""

from __future__ import annotations

import datetime
import functools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_fsdp1_traces as fsdp1  # noqa: E402
import torch  # noqa: E402

from trainmem.trace._dist import rank_base_job, wrapped_step  # noqa: E402

OUT = HERE / "llama_recipes_fsdp1.json"
WORK = Path("/tmp/lrw")
WORLD = 4
CONFIG = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
BASE = {"recompute": "full", "micro_batch_size": 2, "seq_len": 512, "attention": "eager"}
LLAMA_2_7B = {
    **CONFIG,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}
"""Llama-2-7b-hf's config.json, for the published rows' own dims (a fake device holds no bytes)."""
REAL = {"recompute": "full", "micro_batch_size": 4, "seq_len": 2048, "attention": "eager"}
CASES = {
    "full": {**BASE, "precision": "bf16"},
    "full-7b": {**REAL, "precision": "bf16", "config": LLAMA_2_7B},
    "lora-7b": {
        **REAL,
        "precision": "bf16",
        "lora_rank": 8,
        "lora_targets": "q_proj,v_proj",
        "config": LLAMA_2_7B,
    },
    "lora": {**BASE, "precision": "bf16", "lora_rank": 8, "lora_targets": "q_proj,v_proj"},
    "mixed": {**BASE, "precision": "fp32", "mixed_precision": "bfSixteen_mixed"},
}
LORA_ALPHA = 32
LORA_DROPOUT = 0.05
"""llama-recipes configs/peft.py lora_config of July 2023: r 8, lora_alpha 32, q_proj and
v_proj, lora_dropout 0.05."""


def peft_wrap_policy():
    """llama-recipes utils/fsdp_utils.py fsdp_auto_wrap_policy (without its prompt-tuning
    classes): every leaf with a trainable weight, or a LlamaDecoderLayer, is a unit."""
    from torch.distributed.fsdp.wrap import (
        _or_policy,
        lambda_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    def leaf_trainable(module) -> bool:
        w = getattr(module, "weight", None)
        return not list(module.named_children()) and w is not None and w.requires_grad

    return functools.partial(
        _or_policy,
        policies=[
            functools.partial(lambda_auto_wrap_policy, lambda_fn=leaf_trainable),
            functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}
            ),
        ],
    )


def recipes_job(case: dict):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from trainmem.trace._lora import import_peft, in_place_module_to, target_modules

    pure = case["precision"] == "bf16"
    plain = rank_base_job(
        case.get("config", CONFIG),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision=case["precision"],
        attention=case["attention"],
    )
    bf16 = torch.bfloat16
    mixed = MixedPrecision(param_dtype=torch.float32, reduce_dtype=bf16, buffer_dtype=bf16)

    def build():
        job = plain()
        model = job.model
        policy = functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}
        )
        if case.get("lora_rank"):
            peft = import_peft()
            config = peft.LoraConfig(
                r=case["lora_rank"],
                lora_alpha=LORA_ALPHA,
                lora_dropout=LORA_DROPOUT,
                target_modules=target_modules(case["lora_targets"]),
                task_type="CAUSAL_LM",
            )
            with in_place_module_to():
                model = peft.get_peft_model(model, config)
            policy = peft_wrap_policy()
        model = FSDP(
            model,
            auto_wrap_policy=policy,
            mixed_precision=None if pure else mixed,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=torch.device("cuda", 0),
            limit_all_gathers=True,
        )
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
        )
        fsdp1.MODEL[:] = [model]
        job.dtypes_set = True
        fsdp1.JOB[:] = [wrapped_step(job, model)]
        return fsdp1.JOB[0]

    return build


def main() -> None:
    if sys.argv[1] == "--merge":
        cases = [json.loads((WORK / f"{n}.json").read_text()) for n in CASES]
        provenance = {
            "torch": torch.__version__,
            "transformers": "5.24.0",
            "date": datetime.date.today().isoformat(),
            "command": "python tests/data/framework_traces/make_llama_recipes_traces.py CASE; "
            "--merge",
            "device": "trainmem fake cuda (sm90), eager attention; FSDP1 streams/events in "
            "program order (make_fsdp1_traces.py's docstring)",
            "follows": "meta-llama/llama-recipes e5970e2e (2023-07-25) and 597e6342 "
            "(2023-08-05) llama_finetuning.py",
        }
        text = json.dumps({"provenance": provenance, "cases": cases}, indent=1)
        OUT.write_text(text + "\n")
        print(f"wrote {OUT}")
        return
    fsdp1.CASES = CASES
    fsdp1.CONFIG = CASES[sys.argv[1]].get("config", CONFIG)
    fsdp1.WORLD = WORLD
    fsdp1.fsdp1_job = recipes_job
    WORK.mkdir(exist_ok=True)
    result = fsdp1.trace(sys.argv[1])
    (WORK / f"{sys.argv[1]}.json").write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: v for k, v in result.items() if k not in ("saved_at_end_of_forward", "config")},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
