"""bitsandbytes' paged optimizers (engine/_optimizers.py paged_state_bytes): the state buffers of
tensors of 1e5+ elements live in CUDA unified memory (F.get_paged: cudaMallocManaged behind a
torch.frombuffer tensor), so torch's allocator never counts them and they page out to host RAM
under pressure; smaller tensors' states are ordinary device tensors. Figures by hand from
bitsandbytes 0.50.2 optim/optimizer.py (get_state_buffer, Optimizer2State.init_state)."""

from __future__ import annotations

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import estimate_one
from trainmem.engine._frameworks import recipe_optimizer
from trainmem.engine._lora import LORA_TARGETS, lora_num_parameters
from trainmem.engine._optimizers import PAGED_MIN_NUMEL, paged_state_bytes
from trainmem.engine._states import local_tensors
from trainmem.engine._vocab import FRAMEWORKS, OPTIMIZERS

LLAMA = load_model("llama-2-7b")
GIB = 2**30


def _one(**over):
    cfg = {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16",
           "lora_rank": 16, "lora_targets": "all-linear", "qlora": True, **over}  # fmt: skip
    return estimate_one(LLAMA, cfg)


def _tensors():
    groups = ("embed", "layer", "mlp", "final", "head", "moe")
    counts = {g: np.array([float(LLAMA.group_count(g))]) for g in groups}
    one = np.ones(1)
    return local_tensors(LLAMA, tp=one, ep=one, counts=counts, shard=False, dp_shard=one)


def test_only_tensors_of_1e5_elements_or_more_are_paged() -> None:
    # LoRA rank 16 on llama-2-7b (h 4096, f 11008): lora_A of q/k/v/o/gate/up is [16, 4096] =
    # 65,536 elements (< 1e5: on the device), lora_B of them [4096, 16] likewise; down_proj's
    # lora_A is [16, 11008] = 176,128 and gate/up's lora_B [11008, 16] too: paged. Per layer
    # 3 x 176,128 paged elements, x 2 fp32 states x 4 B, x 32 layers.
    full = _tensors()
    mask = np.array([sum(1 << LORA_TARGETS.index(t) for t in LORA_TARGETS)])
    opt = np.array([OPTIMIZERS.index("paged-adamw")])
    got = paged_state_bytes(full, full, opt=opt, sharded=np.array([False]), lora=np.array([True]),
                            lora_rank=np.array([16.0]), mask=mask)  # fmt: skip
    assert 16 * 4096 < PAGED_MIN_NUMEL <= 16 * 11008
    assert got.tolist() == [3 * 16 * 11008 * 2 * 4 * 32]
    eight = paged_state_bytes(full, full, opt=np.array([OPTIMIZERS.index("paged-adamw-8bit")]),
                              sharded=np.array([False]), lora=np.array([True]),
                              lora_rank=np.array([16.0]), mask=mask)  # fmt: skip
    assert eight.tolist() == [3 * 16 * 11008 * 2 * 1 * 32]  # uint8 states; absmax on device
    resident = paged_state_bytes(full, full, opt=np.array([OPTIMIZERS.index("adamw")]),
                                 sharded=np.array([False]), lora=np.array([True]),
                                 lora_rank=np.array([16.0]), mask=mask)  # fmt: skip
    assert resident.tolist() == [0.0]


def test_paged_states_leave_the_device_for_the_host() -> None:
    # Same job, AdamW-8bit resident vs paged: the paged bytes leave optimizer_states and the
    # allocated peak, and appear on the host; the rest of the states (absmax, small tensors)
    # stays.
    resident, paged = _one(optimizer="adamw-8bit"), _one(optimizer="paged-adamw-8bit")
    moved = paged["paged_optimizer_bytes"]
    assert moved > 0 and resident["paged_optimizer_bytes"] == 0
    assert paged["optimizer_states"] == resident["optimizer_states"] - moved
    assert paged["host_bytes"] == resident["host_bytes"] + moved
    assert paged["peak_allocated_bytes"] < resident["peak_allocated_bytes"]


def test_32bit_paged_states_are_fp32_whatever_the_parameters_dtype() -> None:
    # bnb's 32-bit optimizers allocate float32 states (Optimizer2State.init_state), not the
    # parameters' dtype: bf16 LoRA adapters (litgpt) get 4 B per state element like fp32 ones
    # (peft under hf). Rank 64 makes every adapter matrix >= 1e5 elements ([64, 4096] =
    # 262,144), so all of them are paged: 2 states x 4 B x PEFT's adapter count.
    mask = sum(1 << LORA_TARGETS.index(t) for t in LORA_TARGETS)
    adapters = lora_num_parameters(LLAMA, 64, mask)
    for framework in ("hf", "litgpt"):
        out = _one(optimizer="paged-adamw", lora_rank=64, framework=framework)
        assert out["paged_optimizer_bytes"] == 2 * 4 * adapters, framework
        assert out["optimizer_states"] == 0.0, framework


def test_litgpt_qlora_runs_bitsandbytes_paged_adamw() -> None:
    # litgpt 0.5.13 finetune/lora.py: `--quantize bnb.*` builds bnb.optim.PagedAdamW whatever
    # the AdamW named; other stacks keep the optimizer asked for, and LoRA without QLoRA too.
    adamw = np.array([OPTIMIZERS.index("adamw"), OPTIMIZERS.index("adamw-fused")])
    for name in FRAMEWORKS:
        fw = np.full(2, FRAMEWORKS.index(name))
        got = recipe_optimizer(adamw, fw=fw, qlora=np.array([True, True]))
        want = [OPTIMIZERS.index("paged-adamw")] * 2 if name == "litgpt" else adamw.tolist()
        assert got.tolist() == want
        assert recipe_optimizer(adamw, fw=fw, qlora=np.array([False, False])).tolist() == (
            adamw.tolist()
        )
    litgpt = _one(framework="litgpt", optimizer="adamw")
    assert litgpt == _one(framework="litgpt", optimizer="paged-adamw")


def test_the_advice_names_the_optimizer_the_recipe_builds() -> None:
    # The top-consumer words follow the same swap and the built-in's own state dtype: litgpt
    # QLoRA in bf16 names paged-adamw with fp32 states (its adapters are 16-bit); hf keeps adamw.
    from trainmem.engine._advice import _optimizer_states_words, _recipe_optimizer_name

    bf16 = 1  # PRECISIONS.index("bf16")
    litgpt = {"optimizer": "adamw", "framework": "litgpt", "qlora": True, "lora_rank": 8}
    assert _recipe_optimizer_name(litgpt) == "paged-adamw"
    assert _optimizer_states_words(litgpt, prec=bf16, lora=True) == "2 fp32 states per parameter"
    assert _recipe_optimizer_name({**litgpt, "qlora": False}) == "adamw"
    assert _optimizer_states_words({**litgpt, "qlora": False}, prec=bf16, lora=True) == (
        "2 16-bit states per parameter"
    )
    assert _recipe_optimizer_name({**litgpt, "framework": "hf"}) == "adamw"
