"""verl RL recipes (verl b178a3c, 0.8.0.dev; its defaults from
verl/trainer/config/_generated_ppo_trainer.yaml at that commit): the Hydra overrides of a
`python3 -m verl.trainer.main_ppo key=value ...` command in a shell script (after the script's
variables are expanded: stacks/_shell.py), or a YAML of verl's own config tree
(`actor_rollout_ref`, `data`, `algorithm`, `trainer`: a config file or the resolved config a
run prints).

Read: the algorithm (`algorithm.adv_estimator`: gae is PPO with a critic, every other estimator
runs no critic and is read as GRPO), the GPUs (`trainer.n_gpus_per_node` x `trainer.nnodes`),
the prompt and response lengths, the rollout batch and group, the PPO mini- and micro-batches
(per GPU, or verl's deprecated global values divided by the world size), the rollout engine
(name, tensor parallel size, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens),
the log-prob micro-batch, dynamic batch size (`use_dynamic_bsz`: packed rows of
`ppo_max_token_len_per_gpu` tokens), LoRA, gradient checkpointing, the actor's param / optimizer
offload and the reference model (none unless a KL term uses it; offloaded under
`ref.fsdp_config.param_offload`; the LoRA base under LoRA), and the model path.
Said, not modelled: Ulysses sequence parallelism, the entropy term of the loss, Megatron or
other actor strategies, activation offload, fused kernels, a reward model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_bool, as_float, as_int, dig
from ._shell import Script, known, parse_script
from ._stacks import Stack

VERSION = "b178a3c (0.8.0.dev)"
CONFIG = "verl b178a3c verl/trainer/config/_generated_ppo_trainer.yaml"
WORKERS = "verl b178a3c verl/workers/fsdp_workers.py"
ENTRY = re.compile(r"(^|[/.])main_ppo(\.py)?$")
"""The entry point: `-m verl.trainer.main_ppo` or a path to main_ppo.py."""
ROOTS = ("actor_rollout_ref", "algorithm", "trainer", "data", "critic")

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."
DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    A + "ppo_mini_batch_size": 256,
    A + "use_dynamic_bsz": False,
    A + "ppo_max_token_len_per_gpu": 16384,
    A + "use_kl_loss": False,
    A + "fsdp_config.param_offload": False,
    A + "fsdp_config.optimizer_offload": False,
    M + "enable_gradient_checkpointing": True,
    M + "use_remove_padding": True,
    M + "lora_rank": 0,
    M + "target_modules": "all-linear",
    R + "name": "vllm",
    R + "tensor_model_parallel_size": 2,
    R + "gpu_memory_utilization": 0.5,
    R + "n": 1,
    R + "max_num_seqs": 256,
    R + "max_num_batched_tokens": 8192,
    "actor_rollout_ref.ref.fsdp_config.param_offload": False,
}
"""verl's defaults for the keys the reader maps (CONFIG; rollout.name is `???` there, required:
vllm, the engine its examples run)."""
UNMODELLED: dict[str, tuple[tuple[Any, ...], str]] = {
    A + "ulysses_sequence_parallel_size": ((1,), "Ulysses sequence parallelism over the actor"),
    A + "entropy_coeff": ((0,), "the entropy term of the loss (entropy_from_logits on the logits)"),
    A + "strategy": (("fsdp", "fsdp2"), "an actor strategy other than FSDP"),
    M + "enable_activation_offload": ((False,), "activation offload"),
    M + "use_fused_kernels": ((False,), "verl's fused log-prob kernels"),
    "reward_model.enable": ((False,), "a reward model on the GPUs"),
}
"""Keys that change memory and trainmem does not model: (the values it models, verl's default
first; what another value changes)."""


class Overrides:
    """The keys of one verl job: a script's `key=value` overrides, or a YAML's tree."""

    def __init__(self, values: Mapping[str, Any] | None, tree: Any) -> None:
        self.values = values
        self.tree = tree

    def given(self, key: str) -> bool:
        if self.values is not None:
            return key in self.values
        head, _, last = key.rpartition(".")
        parent = dig(self.tree, head) if head else self.tree
        return isinstance(parent, Mapping) and last in parent and parent[last] is not None

    def raw(self, key: str) -> Any:
        if self.values is not None:
            return self.values.get(key)
        return dig(self.tree, key)


def verl_command(script: Script) -> list[str] | None:
    """The words after the entry point of the command that runs verl's PPO trainer."""
    for command in script.commands:
        argv = command.argv
        for k, word in enumerate(argv):
            if ENTRY.search(word) and (word.endswith(".py") or (k and argv[k - 1] == "-m")):
                return argv[k + 1 :]
    return None


def parse_overrides(words: list[str]) -> dict[str, str]:
    """Hydra's `key=value` overrides (`+key=` adds, `++key=` forces: the same value here;
    `~key` deletes: dropped)."""
    out: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        key = key.lstrip("+")
        if eq and key and not key.startswith(("-", "~")):
            out[key] = value.strip("'\"")
    return out


def overrides(doc: Doc) -> Overrides | None:
    if doc.syntax == "shell":
        words = verl_command(parse_script(doc.text))
        return None if words is None else Overrides(parse_overrides(words), None)
    if isinstance(doc.data, Mapping) and "actor_rollout_ref" in doc.data:
        return Overrides(None, doc.data)
    return None


def detect(doc: Doc) -> int:
    """10 for a script that runs verl.trainer.main_ppo, or a YAML of verl's config tree."""
    if doc.syntax == "shell" and "main_ppo" not in doc.text:
        return 0
    return 10 if overrides(doc) is not None else 0


class _Keys:
    """One job's keys read with their origin (the file's, else verl's default)."""

    def __init__(self, doc: Doc, reading: Reading, keys: Overrides) -> None:
        self.doc, self.reading, self.keys = doc, reading, keys

    def text(self, key: str) -> str | None:
        """The file's value at `key`; None when absent or set outside the file (warned)."""
        if not self.keys.given(key):
            return None
        value = self.keys.raw(key)
        if isinstance(value, str) and not known(value):
            self.reading.warn(f"{self.doc.name}:{key}: set outside the file; not read")
            return None
        return value

    def value(self, key: str) -> tuple[Any, bool]:
        """(the value, whether the file gave it): verl's default where the file is silent."""
        given = self.text(key)
        if given is None or (isinstance(given, str) and given.lower() in ("null", "none")):
            return DEFAULTS.get(key), False
        return given, True

    def integer(self, key: str, ge: int = 0) -> tuple[int | None, bool]:
        value, given = self.value(key)
        return (None if value is None else as_int(self.doc, key, value, ge=ge)), given

    def flag(self, key: str) -> bool:
        value, _ = self.value(key)
        return as_bool(self.doc, key, value)

    def put(self, name: str, value: Any, key: str, given: bool, source: str = CONFIG) -> None:
        if given:
            self.reading.put(name, value, self.doc, key)
        else:
            self.reading.default(name, value, f"{source} ({key})")


def read_sizes(k: _Keys) -> int:
    """GPUs, lengths, batches; returns the world size."""
    per_node, g1 = k.integer("trainer.n_gpus_per_node", 1)
    nodes, g2 = k.integer("trainer.nnodes", 1)
    assert per_node is not None and nodes is not None
    world = per_node * nodes
    k.put("num_gpus", world, "trainer.n_gpus_per_node", g1 or g2)
    prompt, gp = k.integer("data.max_prompt_length", 1)
    response, gr = k.integer("data.max_response_length", 1)
    assert prompt is not None and response is not None
    k.put("seq_len", prompt + response, "data.max_prompt_length", gp or gr)
    k.put("response_len", response, "data.max_response_length", gr)
    prompts, gb = k.integer("data.train_batch_size", 1)
    k.put("rollout_batch_size", prompts, "data.train_batch_size", gb)
    n, gn = k.integer(R + "n", 1)
    assert n is not None
    k.put("rl_group_size", n, R + "n", gn)
    mini, gm = k.integer(A + "ppo_mini_batch_size", 1)
    assert mini is not None
    # verl multiplies the mini-batch (prompts) by rollout.n: sequences per optimizer step.
    k.put("global_batch_size", mini * n, A + "ppo_mini_batch_size", gm, WORKERS)
    micro = _per_gpu(k, A + "ppo_micro_batch_size", world)
    if micro is not None:
        k.put("micro_batch_size", micro[0], micro[1], True, WORKERS)
    log_prob = _per_gpu(k, R + "log_prob_micro_batch_size", world)
    if log_prob is not None:
        k.put("log_prob_micro_batch_size", log_prob[0], log_prob[1], True, WORKERS)
    if k.flag(A + "use_dynamic_bsz"):
        tokens, gt = k.integer(A + "ppo_max_token_len_per_gpu", 1)
        k.put("rl_max_token_len_per_gpu", max(tokens or 0, prompt + response),
              A + "ppo_max_token_len_per_gpu", gt)  # fmt: skip
    return world


def _per_gpu(k: _Keys, key: str, world: int) -> tuple[int, str] | None:
    """`key_per_gpu`, else verl's deprecated global `key` divided by the world size (verl
    divides it so: fsdp_workers.py, `ppo_micro_batch_size //= world_size`)."""
    per_gpu, given = k.integer(key + "_per_gpu", 1)
    if given and per_gpu is not None:
        return per_gpu, key + "_per_gpu"
    total, given = k.integer(key, 1)
    if given and total is not None:
        return max(total // world, 1), key
    return None


def read_rollout(k: _Keys) -> None:
    name, given = k.value(R + "name")
    engine = str(name).lower()
    if engine not in ("vllm", "sglang", "hf"):
        k.reading.unmodelled_key(k.doc, R + "name", f"rollout engine {name!r}")
        return
    k.put("rollout", engine, R + "name", given)
    for field, key in (
        ("rollout_tp", "tensor_model_parallel_size"),
        ("rollout_max_num_seqs", "max_num_seqs"),
        ("rollout_max_num_batched_tokens", "max_num_batched_tokens"),
    ):
        value, given = k.integer(R + key, 1)
        k.put(field, value, R + key, given)
    util, given = k.value(R + "gpu_memory_utilization")
    k.put("rollout_gpu_memory_utilization", as_float(k.doc, R + "gpu_memory_utilization", util),
          R + "gpu_memory_utilization", given)  # fmt: skip


def read_trainer(k: _Keys) -> None:
    """The algorithm, LoRA, recompute, offload and the reference model."""
    estimator, given = k.value("algorithm.adv_estimator")
    critic = str(estimator).lower() == "gae"
    k.put("rl", "ppo" if critic else "grpo", "algorithm.adv_estimator", given)
    if not critic and str(estimator).lower() != "grpo":
        k.reading.warn(
            f"rl: {k.doc.name}: algorithm.adv_estimator {estimator!r} runs no critic; read as grpo"
        )
    rank, given = k.integer(M + "lora_rank")
    lora = bool(rank)
    if lora:
        k.put("lora_rank", rank, M + "lora_rank", given)
        targets, tg = k.value(M + "target_modules")
        k.put("lora_targets", _targets(targets), M + "target_modules", tg)
    checkpointing, given = k.value(M + "enable_gradient_checkpointing")
    full = as_bool(k.doc, M + "enable_gradient_checkpointing", checkpointing)
    k.put("recompute", "full" if full else "none", M + "enable_gradient_checkpointing", given)
    params = k.flag(A + "fsdp_config.param_offload")
    optimizer = k.flag(A + "fsdp_config.optimizer_offload")
    offload = {(False, False): "none", (True, False): "params", (False, True): "optimizer"}
    given = k.keys.given(A + "fsdp_config.param_offload") or k.keys.given(
        A + "fsdp_config.optimizer_offload"
    )
    k.put("rl_trainer_offload", offload.get((params, optimizer), "params+optimizer"),
          A + "fsdp_config.param_offload", given)  # fmt: skip
    # verl builds a reference policy only for a KL term (ray_trainer.py use_reference_policy);
    # under LoRA it is the actor's base with the adapters off.
    kl = k.flag(A + "use_kl_loss") or k.flag("algorithm.use_kl_in_reward")
    ref_key = A + "use_kl_loss"
    if not kl:
        ref = "none"
    elif lora:
        ref, ref_key = "shared-lora", M + "lora_rank"
    elif k.flag("actor_rollout_ref.ref.fsdp_config.param_offload"):
        ref, ref_key = "offloaded", "actor_rollout_ref.ref.fsdp_config.param_offload"
    else:
        ref = "separate"
    k.put("ref_model", ref, ref_key, k.keys.given(ref_key), "verl b178a3c ray_trainer.py")


def _targets(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    text = str(value).strip("[]").replace("'", "").replace('"', "").replace(" ", "")
    return text or "all-linear"


def _modelled(doc: Doc, key: str, value: Any, modelled: tuple[Any, ...]) -> bool:
    """Whether a file's value is one trainmem models, read as its kind (a switch, a number,
    a name)."""
    if isinstance(modelled[0], bool):
        return as_bool(doc, key, value) in modelled
    if isinstance(modelled[0], (int, float)):
        return as_float(doc, key, value) in modelled
    return str(value).lower() in modelled


def read_unmodelled(k: _Keys) -> None:
    for key, (modelled, why) in UNMODELLED.items():
        value = k.text(key)
        if value is not None and not _modelled(k.doc, key, value, modelled):
            k.reading.unmodelled_key(k.doc, key, f"{why}: {value}")
    if k.flag(M + "use_remove_padding") and not k.flag(A + "use_dynamic_bsz"):
        default = "" if k.keys.given(M + "use_remove_padding") else " (verl's default)"
        k.reading.warn(
            f"{k.doc.name}: use_remove_padding{default}: the train and score steps are the "
            "padded bound; give --rl-mean-seq-len with the expected tokens per sequence"
        )


def read_model(k: _Keys) -> None:
    path = k.text(M + "path")
    if path is None:
        k.reading.warn(f"{k.doc.name}: no {M}path the file sets; give --model")
        return
    k.reading.put("model", str(path), k.doc, M + "path")


def read(doc: Doc, reading: Reading) -> None:
    keys = overrides(doc)
    if keys is None:
        reading.warn(f"{doc.name}: no verl.trainer.main_ppo command or verl config tree found")
        return
    k = _Keys(doc, reading, keys)
    read_sizes(k)
    read_rollout(k)
    read_trainer(k)
    read_unmodelled(k)
    read_model(k)
    reading.default("zero", 3, f"{WORKERS} (the actor is FSDP FULL_SHARD over every GPU)")
    reading.default("precision", "mixed-bf16", f"{WORKERS} (fp32 actor, bf16 MixedPrecision)")
    reading.default("framework", "verl", f"{WORKERS} (verl's FSDP actor)")


STACK = Stack(
    name="verl",
    version=VERSION,
    framework="verl",
    detect=detect,
    read=read,
)
