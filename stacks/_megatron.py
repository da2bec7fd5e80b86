"""Megatron-LM launch scripts (megatron-core 0.16.1, Megatron-LM megatron/training/arguments.py at
tag core_v0.16.1, commit 55ac7082517c3878ae653c07c09c534b8aed49f6): the pretrain_gpt.py arguments
of a shell script (the command that runs a `*.py` with Megatron's flags, after the script's
variables and arrays are expanded: stacks/_shell.py) or of a functional test's
model_config.yaml (`MODEL_ARGS: {--flag: value}`; `true` is a switch given), and the GPUs of the
torchrun / srun / sbatch lines around it (stacks/_launch.py).

Read: parallel sizes, batch sizes, sequence length, precision, the distributed optimizer and
Megatron-FSDP (zero), recomputation, the attention path, the optimizer and its offload, MoE
capacity, and the model shape, named as a trainmem preset when it equals one. Flags without a
memory effect (learning rates, data, logging, --overlap-grad-reduce ...) are ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_float, as_int, bad
from ._shell import UNKNOWN, Script, known, parse_script
from ._stacks import Stack

ARGUMENTS = "Megatron-LM core_v0.16.1 megatron/training/arguments.py"
MARKERS = ("--micro-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
           "--num-attention-heads", "--global-batch-size")  # fmt: skip
"""Flags only Megatron's argument parser spells so (dashes, not underscores)."""
MARKER_RE = re.compile(
    r"(?<![\w-])--(micro-batch-size|tensor-model-parallel-size|"
    r"pipeline-model-parallel-size|num-attention-heads|global-batch-size)\b"
)
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "BertWordPieceLowerCase": 30522}
"""Vocabulary of the tokenizers whose size is fixed (the GPT-2 BPE and BERT uncased files)."""
UNMODELLED = {
    "--fp8-param-gather": "fp8 parameters instead of 16-bit ones",
    "--grad-reduce-in-bf16": "bf16 main-grad buffer (trainmem keeps Megatron's fp32 one)",
    "--cross-entropy-loss-fusion": "the fused cross entropy's buffers",
    "--tp-comm-overlap": "Transformer Engine userbuffers",
    "--cpu-offloading": "activation / weight offload by layer",
    "--distribute-saved-activations": "checkpoints split over tensor-parallel ranks",
    "--fp4-format": "fp4 GEMMs",
    "--use-legacy-models": "the legacy model code (trainmem follows megatron-core)",
    "--mtp-num-layers": "multi-token prediction layers",
    "--decoder-first-pipeline-num-layers": "an uneven pipeline split",
    "--decoder-last-pipeline-num-layers": "an uneven pipeline split",
    "--pipeline-model-parallel-layout": "a custom pipeline layout",
    "--account-for-embedding-in-pipeline-split": "an uneven pipeline split",
    "--account-for-loss-in-pipeline-split": "an uneven pipeline split",
    "--enable-cuda-graph": "CUDA graph memory pools",
    "--cuda-graph-impl": "CUDA graph memory pools",
    "--recompute-modules": "recomputed modules other than core_attn",
    "--moe-layer-recompute": "MoE layer recomputation",
    "--fine-grained-activation-offloading": "activation offload by module",
}
"""Flags that change memory in ways trainmem does not count."""
LOW_PRECISION_STATES = ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
                        "--exp-avg-sq-dtype")  # fmt: skip


class Args:
    """The parsed arguments: flag -> its words (the last occurrence wins, as argparse does),
    and the key a flag is read at."""

    def __init__(self, values: dict[str, list[str]], prefix: str) -> None:
        self.values, self.prefix = values, prefix

    def has(self, flag: str) -> bool:
        return flag in self.values

    def key(self, flag: str) -> str:
        return self.prefix + flag

    def raw(self, flag: str) -> str | None:
        words = self.values.get(flag)
        return None if words is None else " ".join(words)


def parse_args(argv: list[str]) -> dict[str, list[str]]:
    """`--flag v1 v2` / `--flag=v` / `--switch` words as flag -> values."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            current = out[name] = [value] if eq else []
        elif current is not None:
            current.append(word)
    return out


def yaml_args(data: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """MODEL_ARGS of a Megatron functional test's model_config.yaml (None when not one)."""
    model_args = data.get("MODEL_ARGS")
    if not isinstance(model_args, Mapping) or not any(
        isinstance(k, str) and k.startswith("--") for k in model_args
    ):
        return None
    out: dict[str, list[str]] = {}
    for flag, value in model_args.items():
        if value is False or value is None:
            continue
        words = [] if value is True else [_yaml_word(v) for v in _listed(value)]
        out[str(flag)] = words
    return out


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _yaml_word(value: Any) -> str:
    text = str(value)
    return re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", UNKNOWN, text)


def megatron_command(script: Script) -> tuple[list[str], int] | None:
    """(the command, the index of its `*.py`) that runs Megatron: a Python script followed by
    Megatron's flags."""
    for command in script.commands:
        argv = command.argv
        for k, word in enumerate(argv):
            if word.endswith(".py") and any(m in argv[k + 1 :] for m in MARKERS):
                return argv, k
    return None


def _value(doc: Doc, reading: Reading, args: Args, flag: str) -> str | None:
    """A flag's one value; None when absent or set outside the file (warned)."""
    words = args.values.get(flag)
    if not words:
        return None
    text = words[0].strip("'\"")
    if not known(text):
        reading.warn(f"{doc.name}:{args.key(flag)}: set outside the file; not read")
        return None
    return text


def _int(doc: Doc, reading: Reading, args: Args, flag: str, ge: int = 1) -> int | None:
    text = _value(doc, reading, args, flag)
    return None if text is None else as_int(doc, args.key(flag), text, ge=ge)


PARALLEL = (
    ("tp", "--tensor-model-parallel-size"),
    ("pp", "--pipeline-model-parallel-size"),
    ("cp", "--context-parallel-size"),
    ("ep", "--expert-model-parallel-size"),
    ("etp", "--expert-tensor-parallel-size"),
    ("micro_batch_size", "--micro-batch-size"),
    ("global_batch_size", "--global-batch-size"),
    ("seq_len", "--seq-length"),
)


def read_sizes(doc: Doc, reading: Reading, args: Args) -> None:
    """Parallel degrees, batch sizes, sequence length, virtual stages, sequence parallelism."""
    for name, flag in PARALLEL:
        value = _int(doc, reading, args, flag)
        if value is not None:
            reading.put(name, value, doc, args.key(flag))
    if not args.has("--micro-batch-size"):
        reading.warn(f"{doc.name}: --micro-batch-size is required by {ARGUMENTS} (validate_args)")
    tp = reading.get("tp", 1)
    if args.has("--num-experts") and tp > 1 and not args.has("--expert-tensor-parallel-size"):
        reading.default(
            "etp",
            tp,
            f"{ARGUMENTS} validate_args (expert_tensor_parallel_size "
            "defaults to tensor_model_parallel_size)",
        )
    if args.has("--sequence-parallel"):
        reading.put("sequence_parallel", tp > 1, doc, args.key("--sequence-parallel"))
        if tp == 1:
            reading.warn(
                f"{doc.name}:{args.key('--sequence-parallel')}: Megatron turns sequence "
                f"parallelism off at tensor parallel size 1 ({ARGUMENTS} validate_args)"
            )
    read_virtual(doc, reading, args)


def read_virtual(doc: Doc, reading: Reading, args: Args) -> None:
    for flag in (
        "--virtual-pipeline-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
    ):
        value = _int(doc, reading, args, flag)
        if value is not None:
            reading.put("virtual_stages", value, doc, args.key(flag))
            return
    flag = "--num-layers-per-virtual-pipeline-stage"
    per_stage = _int(doc, reading, args, flag)
    layers = _int(doc, reading, args, "--num-layers")
    if per_stage is None or layers is None:
        return
    pp = reading.get("pp", 1)
    if layers % (pp * per_stage):
        raise bad(
            doc, args.key(flag), f"a divisor of --num-layers / pp ({layers} / {pp})", per_stage
        )
    reading.put("virtual_stages", layers // (pp * per_stage), doc, args.key(flag))


def read_precision(doc: Doc, reading: Reading, args: Args) -> None:
    """--fp8-format (with --bf16): fp8-mixed; --bf16 / --fp16: Megatron's mixed precision (16-bit
    weights, fp32 main params and grads); neither: fp32."""
    if args.has("--fp8-format"):
        value = _value(doc, reading, args, "--fp8-format")
        if value not in ("e4m3", "hybrid", None):
            raise bad(doc, args.key("--fp8-format"), "e4m3 or hybrid", value)
        reading.put("precision", "fp8-mixed", doc, args.key("--fp8-format"))
    elif args.has("--bf16"):
        reading.put("precision", "mixed-bf16", doc, args.key("--bf16"))
    elif args.has("--fp16"):
        reading.put("precision", "mixed-fp16", doc, args.key("--fp16"))
    else:
        reading.default(
            "precision",
            "fp32",
            "megatron-core 0.16.1 megatron/core/"
            "model_parallel_config.py (fp16 and bf16 default False: fp32 weights)",
        )


SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""--data-parallel-sharding-strategy (Megatron-FSDP) as a ZeRO stage."""


def read_sharding(doc: Doc, reading: Reading, args: Args) -> None:
    """--use-distributed-optimizer: ZeRO 1; Megatron-FSDP's sharding strategy; torch FSDP2."""
    zero, key = 0, None
    if args.has("--use-distributed-optimizer"):
        zero, key = 1, args.key("--use-distributed-optimizer")
    if args.has("--use-megatron-fsdp"):
        flag = "--data-parallel-sharding-strategy"
        strategy = _value(doc, reading, args, flag) or "no_shard"
        if strategy not in SHARDING:
            raise bad(doc, args.key(flag), "|".join(SHARDING), strategy)
        if SHARDING[strategy] >= zero:
            zero = SHARDING[strategy]
            key = args.key(flag if args.has(flag) else "--use-megatron-fsdp")
    if args.has("--use-torch-fsdp2"):
        zero, key = 3, args.key("--use-torch-fsdp2")
        reading.unmodelled_key(
            doc,
            key,
            "torch FSDP2 under Megatron: trainmem's megatron mode counts ZeRO-3 as Megatron-FSDP",
        )
    if key is not None:
        reading.put("zero", zero, doc, key)
    instances = _int(doc, reading, args, "--num-distributed-optimizer-instances")
    if instances is not None and instances > 1:
        reading.unmodelled_key(
            doc,
            args.key("--num-distributed-optimizer-instances"),
            "optimizer states sharded over dp / instances (give --dp-shard)",
        )


def read_recompute(doc: Doc, reading: Reading, args: Args) -> None:
    """--recompute-activations / --recompute-granularity selective: the attention core;
    full with --recompute-method uniform (1 layer a unit) or block (the first N layers of each
    stage: trainmem's selective-layer when N = floor(layers / every))."""
    flag = "--recompute-granularity"
    granularity = _value(doc, reading, args, flag)
    if granularity is None and args.has("--recompute-activations"):
        reading.put("recompute", "selective", doc, args.key("--recompute-activations"))
        return
    if granularity is None:
        return
    if granularity == "selective":
        reading.put("recompute", "selective", doc, args.key(flag))
        return
    if granularity != "full":
        raise bad(doc, args.key(flag), "full or selective", granularity)
    method = _value(doc, reading, args, "--recompute-method")
    count = _int(doc, reading, args, "--recompute-num-layers", ge=0)
    if method not in ("uniform", "block"):
        raise bad(
            doc,
            args.key("--recompute-method"),
            "uniform or block (with --recompute-granularity full)",
            method,
        )
    if count is None:
        raise bad(
            doc,
            args.key("--recompute-num-layers"),
            "a layer count (with --recompute-granularity full)",
            count,
        )
    if method == "uniform":
        reading.put("recompute", "full", doc, args.key(flag))
        if count > 1:
            reading.unmodelled_key(
                doc,
                args.key("--recompute-num-layers"),
                f"units of {count} layers: one input kept per unit, the unit recomputed at once",
            )
        return
    _block(doc, reading, args, count)


def _block(doc: Doc, reading: Reading, args: Args, count: int) -> None:
    layers = _int(doc, reading, args, "--num-layers")
    stages = reading.get("pp", 1) * reading.get("virtual_stages", 1)
    key, count_key = args.key("--recompute-granularity"), args.key("--recompute-num-layers")
    if layers is None or layers % stages:
        reading.put("recompute", "full", doc, key)
        reading.unmodelled_key(doc, count_key, "block recomputation of a stage of unknown size")
        return
    per_stage = layers // stages
    if count == 0:
        reading.put("recompute", "none", doc, count_key)
    elif count >= per_stage:
        reading.put("recompute", "full", doc, key)
    else:
        every = next((e for e in range(1, per_stage + 1) if per_stage // e == count), None)
        reading.put("recompute", "selective-layer", doc, key)
        if every is None:
            reading.unmodelled_key(
                doc,
                count_key,
                f"{count} of {per_stage} layers a stage "
                "checkpointed: no every-N-th count equals it",
            )
        else:
            reading.put("recompute_every", every, doc, count_key)


def read_attention(doc: Doc, reading: Reading, args: Args) -> None:
    """Transformer Engine's attention (the default, --attention-backend auto / flash / fused)
    keeps no scores: flash. TE's unfused backend, megatron-core's local attention
    (--transformer-impl local, --attention-backend local) and the legacy models without
    --use-flash-attn materialise them: eager, eager-unfused under --no-masked-softmax-fusion
    (Megatron's torch softmax path; masked_softmax_fusion is on by default, arguments.py)."""
    backend = _value(doc, reading, args, "--attention-backend")
    impl = _value(doc, reading, args, "--transformer-impl")
    if backend not in (None, "auto", "flash", "fused", "unfused", "local"):
        raise bad(doc, args.key("--attention-backend"), "auto|flash|fused|unfused|local", backend)
    if args.has("--use-legacy-models"):
        eager = not args.has("--use-flash-attn")
        key = "--use-flash-attn" if not eager else "--use-legacy-models"
    elif impl == "local" or backend in ("local", "unfused"):
        eager, key = True, "--transformer-impl" if impl == "local" else "--attention-backend"
    else:
        if backend in ("flash", "fused"):
            reading.put("attention", "flash", doc, args.key("--attention-backend"))
        return
    if not eager:
        reading.put("attention", "flash", doc, args.key(key))
    elif args.has("--no-masked-softmax-fusion") and backend != "unfused":
        reading.put("attention", "eager-unfused", doc, args.key("--no-masked-softmax-fusion"))
    else:
        reading.put("attention", "eager", doc, args.key(key))


OPTIMIZER_SOURCE = (
    f"{ARGUMENTS} (--optimizer default adam); megatron-core 0.16.1 "
    "megatron/core/optimizer/__init__.py (Transformer Engine's or apex's "
    "FusedAdam: no step temporaries)"
)


def read_optimizer(doc: Doc, reading: Reading, args: Args) -> None:
    """adam (Megatron's decoupled, fused Adam): adamw-fused; sgd: sgd-momentum unless
    --sgd-momentum 0; --optimizer-cpu-offload: the optimizer offloaded."""
    flag = "--optimizer"
    name = _value(doc, reading, args, flag)
    if name is None:
        reading.default("optimizer", "adamw-fused", OPTIMIZER_SOURCE)
    elif name == "adam":
        reading.put("optimizer", "adamw-fused", doc, args.key(flag))
    elif name == "sgd":
        momentum = _value(doc, reading, args, "--sgd-momentum")
        still = momentum is not None and as_float(doc, args.key("--sgd-momentum"), momentum) == 0
        reading.put("optimizer", "sgd" if still else "sgd-momentum", doc, args.key(flag))
    elif name in ("muon", "dist_muon"):
        reading.unmodelled_key(doc, args.key(flag), f"the {name} optimizer")
    else:
        raise bad(doc, args.key(flag), "adam|sgd|muon|dist_muon", name)
    if args.has("--optimizer-cpu-offload"):
        reading.put("offload", "optimizer", doc, args.key("--optimizer-cpu-offload"))
        fraction = _value(doc, reading, args, "--optimizer-offload-fraction")
        if (
            fraction is not None
            and as_float(doc, args.key("--optimizer-offload-fraction"), fraction) != 1.0
        ):
            reading.unmodelled_key(
                doc, args.key("--optimizer-offload-fraction"), "part of the optimizer offloaded"
            )
    for dtype_flag in LOW_PRECISION_STATES:
        value = _value(doc, reading, args, dtype_flag)
        if value not in (None, "fp32"):
            reading.unmodelled_key(doc, args.key(dtype_flag), f"{value} optimizer state")


def read_unmodelled(doc: Doc, reading: Reading, args: Args) -> None:
    for flag, why in UNMODELLED.items():
        if args.has(flag):
            value = args.raw(flag)
            if flag == "--cuda-graph-impl" and value == "none":
                continue
            reading.unmodelled_key(doc, args.key(flag), why)
    level = _int(doc, reading, args, "--empty-unused-memory-level", ge=0)
    if level:
        reading.unmodelled_key(
            doc,
            args.key("--empty-unused-memory-level"),
            "torch.cuda.empty_cache() each step: less cached memory",
        )
    factor = _value(doc, reading, args, "--moe-expert-capacity-factor")
    if factor is not None:
        reading.put(
            "capacity_factor",
            as_float(doc, args.key("--moe-expert-capacity-factor"), factor),
            doc,
            args.key("--moe-expert-capacity-factor"),
        )


def script_shape(doc: Doc, reading: Reading, args: Args) -> dict[str, Any] | None:
    """The model shape the arguments build (Megatron's defaults where they are silent:
    validate_args' ffn_hidden_size, num_query_groups only under --group-query-attention,
    LayerNorm, learned absolute positions, tied embeddings); None without the required sizes."""
    layers, hidden, heads = (
        _int(doc, reading, args, f)
        for f in ("--num-layers", "--hidden-size", "--num-attention-heads")
    )
    if layers is None or hidden is None or heads is None:
        return None
    gated = args.has("--swiglu")
    ffn = _int(doc, reading, args, "--ffn-hidden-size")
    default_ffn = int((4 * hidden * 2 / 3) / 64) * 64 if gated else 4 * hidden
    groups = _int(doc, reading, args, "--num-query-groups")
    experts = _int(doc, reading, args, "--num-experts") or 0
    vocab = _int(doc, reading, args, "--vocab-size")
    if vocab is None:
        vocab = TOKENIZER_VOCAB.get(_value(doc, reading, args, "--tokenizer-type") or "")
    if vocab is None and args.has("--merge-file") and not args.has("--tokenizer-type"):
        vocab = TOKENIZER_VOCAB["GPT2BPETokenizer"]  # a vocab and merge file: GPT-2 BPE
    position = _value(doc, reading, args, "--position-embedding-type") or "learned_absolute"
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": groups if args.has("--group-query-attention") and groups else heads,
        "intermediate_size": ffn or default_ffn,
        "ffn_given": ffn is not None,
        "gated_mlp": gated,
        "tie_word_embeddings": not args.has("--untie-embeddings-and-output-weights"),
        "num_experts": experts,
        "num_experts_per_tok": (_int(doc, reading, args, "--moe-router-topk") or 2)
        if experts
        else 0,
        "moe_intermediate_size": _int(doc, reading, args, "--moe-ffn-hidden-size")
        or ffn
        or default_ffn,
        "vocab_size": vocab,
        "norm": "rms"
        if _value(doc, reading, args, "--normalization") == "RMSNorm"
        else "layernorm",
        "rotary": position == "rope" or args.has("--use-rotary-position-embeddings"),
        "max_position_embeddings": _int(doc, reading, args, "--max-position-embeddings"),
    }


HARD = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "gated_mlp", "tie_word_embeddings", "num_experts")  # fmt: skip
SOFT = ("norm", "rotary", "max_position_embeddings")
"""Matched when they can be (a tie-break): they change memory little or not at all."""


def _matches(spec: Any, shape: dict[str, Any]) -> bool:
    if any(getattr(spec, k) != shape[k] for k in HARD):
        return False
    if (shape["ffn_given"] or not shape["num_experts"]) and (
        spec.intermediate_size != shape["intermediate_size"]
    ):
        return False
    if shape["num_experts"] and (
        spec.num_experts_per_tok != shape["num_experts_per_tok"]
        or spec.moe_intermediate_size != shape["moe_intermediate_size"]
    ):
        return False
    return shape["vocab_size"] is None or spec.vocab_size == shape["vocab_size"]


def match_preset(shape: dict[str, Any]) -> list[str]:
    """The presets of this shape, best first (the soft keys that agree, then the name)."""
    from trainmem.catalog import load_model, model_presets

    found = []
    for name in model_presets():
        spec = load_model(name)
        if _matches(spec, shape):
            score = sum(getattr(spec, k) == shape[k] for k in SOFT)
            found.append((-score, name))
    return [name for _, name in sorted(found)]


def read_model(doc: Doc, reading: Reading, args: Args) -> None:
    shape = script_shape(doc, reading, args)
    if shape is None:
        reading.warn(
            f"{doc.name}: no --num-layers / --hidden-size / --num-attention-heads; give --model"
        )
        return
    names = match_preset(shape)
    described = (
        f"{shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
        f"{shape['num_attention_heads']} heads"
    )
    if not names:
        reading.warn(
            f"{doc.name}: the model the arguments build ({described}) is no trainmem "
            "preset; give --model (a preset or a config.json)"
        )
        return
    reading.put("model", names[0], doc, args.key("--num-layers"))
    from trainmem.catalog import load_model

    spec = load_model(names[0])
    notes = [k for k in SOFT if shape[k] is not None and getattr(spec, k) != shape[k]]
    if shape["vocab_size"] is None:
        notes.append("vocabulary (the tokenizer's; the preset's used)")
    also = f"; same shape: {', '.join(names[1:])}" if len(names) > 1 else ""
    differs = f"; differs in {', '.join(notes)}" if notes else ""
    reading.warn(
        f"model: {doc.name}'s arguments ({described}) read as preset {names[0]!r}{differs}{also}"
    )
    _padding(doc, reading, args, spec.vocab_size)


def _padding(doc: Doc, reading: Reading, args: Args, vocab: int) -> None:
    divisor = _int(doc, reading, args, "--make-vocab-size-divisible-by") or 128
    multiple = divisor * reading.get("tp", 1)
    padded = -(-vocab // multiple) * multiple
    if padded != vocab:
        reading.warn(
            f"{doc.name}: Megatron pads the vocabulary to {padded} (a multiple of "
            f"--make-vocab-size-divisible-by {divisor} x tp); the preset's {vocab} is used"
        )


def arguments(doc: Doc) -> tuple[Args, Script | None] | None:
    """The Megatron arguments of a file (and its script, for the launcher around them)."""
    if doc.syntax == "shell":
        script = parse_script(doc.text)
        found = megatron_command(script)
        if found is None:
            return None
        argv, k = found
        return Args(parse_args(argv[k + 1 :]), ""), script
    if isinstance(doc.data, Mapping):
        values = yaml_args(doc.data)
        return None if values is None else (Args(values, "MODEL_ARGS."), None)
    return None


def detect(doc: Doc) -> int:
    """10 for a shell script or model_config.yaml that passes Megatron's own flags."""
    if doc.syntax == "shell":
        if not MARKER_RE.search(doc.text):
            return 0
        return 10 if arguments(doc) is not None else 0
    if isinstance(doc.data, Mapping):
        values = yaml_args(doc.data)
        return 10 if values is not None and any(m in values for m in MARKERS) else 0
    return 0


def read(doc: Doc, reading: Reading) -> None:
    found = arguments(doc)
    if found is None:
        reading.warn(f"{doc.name}: no command with Megatron's arguments found")
        return
    args, script = found
    read_sizes(doc, reading, args)
    read_precision(doc, reading, args)
    read_sharding(doc, reading, args)
    read_recompute(doc, reading, args)
    read_attention(doc, reading, args)
    read_optimizer(doc, reading, args)
    read_unmodelled(doc, reading, args)
    read_model(doc, reading, args)
    if script is not None:
        from ._launch import gpus_of, read_allocator, read_gpu

        gpus = gpus_of(doc, reading, script)
        if gpus is not None:
            reading.put("num_gpus", gpus[0], doc, gpus[1])
        read_gpu(doc, reading, script)
        read_allocator(doc, reading, script)
    elif not reading.has("num_gpus"):
        reading.warn(
            f"{doc.name}: the GPU count is the test recipe's, not this file's; give --num-gpus"
        )
    _script_name(doc, reading, script)


def _script_name(doc: Doc, reading: Reading, script: Script | None) -> None:
    if script is None:
        return
    found = megatron_command(script)
    if found is not None:
        name = os.path.basename(found[0][found[1]])
        if name not in ("pretrain_gpt.py", "\x00/pretrain_gpt.py") and not name.endswith(
            "pretrain_gpt.py"
        ):
            reading.warn(f"{doc.name}: runs {name}; read as pretrain_gpt.py's arguments")


STACK = Stack(
    name="megatron",
    version="0.16.1",
    framework="megatron",
    detect=detect,
    read=read,
)
