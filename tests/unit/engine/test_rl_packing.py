"""The RL trainer's own micro-batches (engine/_rl.py packed_micro_batches, unpadded_seq_len)
and verl's actor loss (engine/_frameworks.py `verl`: flash-attn's cross entropy on the bf16
logits, its gradient written into them): golden numbers, the score phase of an offloaded
trainer, and bad input (one line naming the field, exit 2)."""

from __future__ import annotations

import numpy as np
import pytest

import trainmem
from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.engine import GIB
from trainmem.engine._grid import make_grid
from trainmem.engine._loss import compiled_loss_kept_bytes, loss_gradient_bytes
from trainmem.engine._rl import packed_micro_batches, trainer_grid

QWEN7B = load_model("qwen2.5-7b")

GRPO = {
    # verl's Qwen2.5-7B GRPO shape on 8 GPUs: 256 prompts x 5 responses per optimizer step,
    # prompt 512 + response 1024, micro 4, FSDP, gradient checkpointing.
    "model": "qwen2.5-7b",
    "gpu": "h100-sxm-80gb",
    "num_gpus": 8,
    "zero": 3,
    "precision": "mixed-bf16",
    "recompute": "full",
    "micro_batch_size": 4,
    "seq_len": 1536,
    "response_len": 1024,
    "global_batch_size": 1280,
    "rl": "grpo",
    "rl_group_size": 5,
    "rollout_batch_size": 1024,
    "rollout_tp": 2,
    "rollout_gpu_memory_utilization": 0.6,
    "framework": "verl",
}


def _grid(**fields):
    config = {k: v for k, v in {**GRPO, **fields}.items() if k not in ("model", "gpu")}
    return make_grid(config)


def test_dynamic_bsz_packs_one_row_of_max_token_len() -> None:
    # 1280 responses over 8 ranks: 160 per rank, at most 1536 tokens each = 245,760 tokens,
    # ceil(245,760 / 16,384) = 15 packed micro-batches per rank (verl rearrange_micro_batches).
    got = packed_micro_batches(_grid(rl_max_token_len_per_gpu=16384))
    assert int(got["micro_batch_size"][0]) == 1
    assert int(got["seq_len"][0]) == 16384
    assert int(got["global_batch_size"][0]) == 15 * 8


def test_remove_padding_packs_the_micro_batch_real_tokens() -> None:
    # use_remove_padding without dynamic bsz: micro 4 sequences of 370 real tokens = one row of
    # 1480 tokens; the step keeps its 1280 / (4 x 8) = 40 micro-batches per rank.
    got = packed_micro_batches(_grid(rl_mean_seq_len=370))
    assert int(got["micro_batch_size"][0]) == 1
    assert int(got["seq_len"][0]) == 4 * 370
    assert int(got["global_batch_size"][0]) == 40 * 8
    # Without either, the padded micro-batch as given.
    plain = trainer_grid(_grid())
    assert int(plain["seq_len"][0]) == 1536 and int(plain["micro_batch_size"][0]) == 4


def test_packed_train_phase_grows_with_the_token_budget() -> None:
    small = trainmem.estimate(advice=False, **GRPO, rl_max_token_len_per_gpu=8192)
    large = trainmem.estimate(advice=False, **GRPO, rl_max_token_len_per_gpu=32768)
    assert large["rl"]["phases"]["train"] > small["rl"]["phases"]["train"]
    assert large["rl"]["phases"]["score"] > small["rl"]["phases"]["score"]
    # A packed micro-batch of 8192 tokens is the padded micro-batch's trainer step at micro 1 x
    # seq 8192: the same engine, the same bytes.
    step = trainmem.estimate(
        advice=False,
        **{k: v for k, v in GRPO.items() if k not in ("rl", "rl_group_size", "rollout_batch_size")}
        | {"rollout_tp": 1, "rollout_gpu_memory_utilization": 0.5}
        | {"micro_batch_size": 1, "seq_len": 8192, "response_len": 512, "global_batch_size": 0},
    )
    assert small["breakdown_at_peak"]["activations"] == pytest.approx(
        step["breakdown_at_peak"]["activations"], rel=1e-9
    )


def test_verl_loss_keeps_the_bf16_logits_and_writes_its_gradient_into_them() -> None:
    # flash-attn cross_entropy_loss(inplace_backward=True): saved logits (2 bytes each) and an
    # fp32 logsumexp per token; no gradient tensor of its own at the start of backward.
    T = np.array([4096.0])
    kept = compiled_loss_kept_bytes(QWEN7B, T=T, e=2.0, loss_tp_div=1.0)
    assert float(kept[0]) == (2.0 * QWEN7B.vocab_size + 4.0) * 4096
    kinds = dict(chunked_output=False, loss_tp_div=1.0, sp_div=1.0, zero_col=np.zeros(1))
    common = dict(T=T, e=2.0, pp=1.0, last=True, chunked=False, **kinds)
    in_place = loss_gradient_bytes(QWEN7B, compiled=True, grad_in_place=True, **common)
    written = loss_gradient_bytes(QWEN7B, compiled=True, **common)
    plain = loss_gradient_bytes(QWEN7B, **common)
    assert float(in_place[0]) == 0.0
    assert float(written[0]) == 2.0 * 4096 * QWEN7B.vocab_size  # a compiled loss: one bf16 grad
    assert float(plain[0]) == 8.0 * 4096 * QWEN7B.vocab_size  # two fp32 [T, v] gradients


def test_verl_step_is_hf_less_the_fp32_loss_tensors() -> None:
    # The same transformers model code and states; at the start of backward the HF loss holds
    # the fp32 log-softmax and two fp32 gradients (12 bytes per logit) that verl's in-place
    # loss does not: at 16k tokens x 152k vocab that is ~28 GiB, so verl's peak is far under.
    job = {k: v for k, v in GRPO.items() if k not in ("rl", "rl_group_size", "rollout_batch_size")}
    job |= {"rollout_tp": 1, "rollout_gpu_memory_utilization": 0.5}
    job |= {"micro_batch_size": 1, "seq_len": 16384, "response_len": 512, "global_batch_size": 0}
    verl = trainmem.estimate(advice=False, **job)
    hf = trainmem.estimate(advice=False, **{**job, "framework": "hf"})
    assert verl["peak_allocated_bytes"] < hf["peak_allocated_bytes"] - 10 * GIB
    for state in ("parameters", "gradients", "optimizer_states"):
        assert verl["breakdown_at_peak"][state] == hf["breakdown_at_peak"][state]


def test_score_phase_loads_the_offloaded_parameters_back() -> None:
    # verl compute_log_prob: load_fsdp_model_to_gpu under param_offload, so the old policy's
    # forward holds the fp32 sharded parameters although they sit on the CPU during rollout.
    off = trainmem.estimate(advice=False, **GRPO, rl_trainer_offload="params+optimizer")
    rl = off["rl"]
    assert rl["trainer_resident_bytes"] == 0
    params = off["breakdown_at_peak"]["parameters"]
    assert params > 3 * GIB  # 7.6e9 fp32 parameters over 8 ranks
    assert rl["phases"]["score"] >= params + rl["score_logits_bytes"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--rl", "grpo", "--seq-len", "2048", "--rl-max-token-len-per-gpu", "1024"],
         "rl_max_token_len_per_gpu"),
        (["--rl", "grpo", "--seq-len", "2048", "--rl-mean-seq-len", "4096"], "rl_mean_seq_len"),
        (["--rl-max-token-len-per-gpu", "16384"], "rl_max_token_len_per_gpu"),
    ],
)  # fmt: skip
def test_bad_packing_input_is_one_line_exit_2(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1, err


def test_top_consumers_describe_the_trainers_own_step() -> None:
    # At a train-phase peak the consumers describe the unpadded micro-batch the step ran on
    # (16 x 400 tokens), not the padded job's 16 x 1536; verl keeps no fp32 [T, v] loss
    # gradients (its fused loss writes into the bf16 logits), HF's eager loss two of them.
    low = {**GRPO, "rl_mean_seq_len": 400, "rollout_gpu_memory_utilization": 0.1}
    hf = trainmem.estimate(advice=False, **{**low, "framework": "hf", "micro_batch_size": 16})
    verl = trainmem.estimate(advice=False, **{**low, "micro_batch_size": 32, "recompute": "none"})
    assert hf["rl"]["peak_phase"] == verl["rl"]["peak_phase"] == "train"
    named = [c["what"] for c in hf["top_consumers"] if "loss gradients" in c["what"]]
    assert len(named) == 1 and "two [6,400, 152,064] tensors" in named[0], named
    assert not any("loss gradient" in c["what"] for c in verl["top_consumers"])
