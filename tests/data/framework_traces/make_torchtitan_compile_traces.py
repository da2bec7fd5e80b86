"""Regenerate torchtitan_llama3_compile.json: what torch.compile (torchtitan's per-block compile)
changes in the activations a Llama 3 block keeps for backward, under no AC, torchtitan's per-op
SelectiveAC and FullAC, on trainmem's fake CUDA device. Companion of make_torchtitan_traces.py
(same model, loss, step, policies; that file's eager traces are the baseline).

Pinned: torchtitan 0.3.0, torch 2.13.0+cpu. Not run at test time.

    PYTHONPATH=<repo root>:/path/to/torchtitan-src:/path/to/deps \
        python tests/data/framework_traces/make_torchtitan_compile_traces.py

Compile as torchtitan applies it (distributed/compile.py apply_compile, after AC wrapping):
torch.compile(block, fullgraph=True) per TransformerBlock (the AC wrapper when there is one),
loss and the rest of the model eager. Backend: torchtitan uses inductor; inductor cannot generate
kernels for fake CUDA tensors on a CPU build, so the backend here is AOTAutograd with inductor's
own pieces up to the partition: inductor's decomposition table (select_decomp_table) and
inductor's partition_fn (torch._inductor.compile_fx.partition_fn: inductor's joint-graph passes,
then min_cut_rematerialization_partition). The partitioned forward and backward graphs run as
aten graphs (no fusion), so what stays alive between forward and backward is exactly the
partitioned forward's saved outputs; transient peaks inside a graph are aten's, not inductor's
(inductor fuses elementwise chains and frees buffers by its own schedule).
Cross-check (at /tmp, not stored): on CPU real bf16 tensors at the same dims, real inductor
(C++ codegen) and this backend partition the no-AC block identically (same 13 saved tensors).

The tracer (trainmem.trace._step.Tracker) is a TorchDispatchMode; dynamo skips frames under a
user dispatch mode, so here it declares ignore_compile_internals (the mode is off while
compiling and sees the compiled graphs' aten ops when they run). Every block (eager or
compiled) sits in an eager shell (Scoped) that the tracer's per-block hooks attach to, so they
stay outside the compiled region; the shell's tensor hooks also mark where each block's backward
starts and ends (backward_working_set_by_layer_bytes: peak live bytes inside that span minus
live bytes at its start, parameter gradients and AC recomputation included). Each case runs in
a fresh process (kernels registered by one trace and dynamo/AOT state change a later trace's
compiled backward graph).

rms_norm rows: "composite" is the CPU build's decomposition on the fake device (as
torchtitan_llama3_ac.json's composite rows); "fused" is the CUDA kernel's saved set (trainmem's
trace/_norm.py gpu_rms_norm where step_contexts has it, else make_torchtitan_traces.py's
emulation). A compiled block saves the same set either way (inductor decomposes
_fused_rms_norm); only the backward graph differs.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import make_torchtitan_traces as mk  # noqa: E402  (stubs minimal_async_ep, patches the Tracker)

import torch  # noqa: E402
import torch._functorch.partitioners as partitioners  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from _trace_origins import saved_since  # noqa: E402

OUT = Path(__file__).with_name("torchtitan_llama3_compile.json")
SHAPES = [(1, 1024), (2, 2048)]
POLICIES = ["none", "selective_op", "full"]
PARTITIONS: list[dict] = []
FOLD = False

step.Tracker.ignore_compile_internals = classmethod(lambda cls: True)

_VIEWS = {getattr(torch.ops.aten, n).default for n in (
    "view", "t", "permute", "reshape", "unsqueeze", "expand", "_unsafe_view", "alias")} | {
    torch.ops.aten.transpose.int, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
    torch.ops.aten.squeeze.dim}


def _saved(fw: torch.fx.GraphModule, num_fwd_outputs: int) -> list[dict]:
    """The partitioned forward's outputs past the user outputs: what backward receives."""
    outs = fw.graph.find_nodes(op="output")[0].args[0]
    out = []
    for n in outs[num_fwd_outputs:]:
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else n
        if not isinstance(v, torch.Tensor):
            out.append({"name": getattr(n, "name", str(n)), "kind": "symint"})
            continue
        base = n
        while base.op == "call_function" and base.target in _VIEWS:
            base = base.args[0]
        item = {"name": n.name, "shape": [d if isinstance(d, int) else str(d) for d in v.shape], "dtype": str(v.dtype).replace("torch.", "")}
        if base.op == "placeholder":
            item["input"] = base.name  # a graph input (parameter, block input) or a view of one
        elif v.device.type != "cuda":  # the CPU generator state of a recomputed RNG op
            item["op"] = str(base.target)
            item["host"] = True
        else:
            item["op"] = str(base.target)
            item["bytes"] = int(v.numel() * v.element_size())
        out.append(item)
    return out


@contextlib.contextmanager
def _patched(owner, name, value):
    plain = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, plain)


def _partition(gm, joint_inputs, **kw):
    # joint_graph_constant_folding evaluates constant subgraphs on real tensors, which a fake
    # CUDA device cannot allocate; it only rewrites uniform-valued constants (no effect on which
    # activations are saved: checked on CPU real tensors, see the module docstring).
    # A recomputed RNG-tagged op (the flash kernel takes a philox seed; FullAC recomputes it)
    # gets its generator state threaded from forward to backward; the graph-safe variant reads
    # torch.cuda.default_generators, which a CPU build has none of. Without it the partitioner
    # saves the CPU generator state (a host tensor, not device memory); on a GPU it would save a
    # cloned CUDA generator (a host object too). Nothing else in the partition depends on it.
    with torch._inductor.config.patch(joint_graph_constant_folding=FOLD), \
            _patched(partitioners, "supports_graphsafe_rng", lambda device: False):
        fw, bw = compile_fx.partition_fn(gm, joint_inputs, **kw)
    PARTITIONS.append({"saved": _saved(fw, kw["num_fwd_outputs"]), "fw_code": fw.code,
                       "bw_code": bw.code})
    return fw, bw


def _run_and_save_rng_state(op, *args, **kwargs):
    with torch.utils._python_dispatch._disable_current_modes():
        state = torch.get_rng_state()
    return state, op(*args, **kwargs)


def _run_with_rng_state(state, op, *args, **kwargs):
    return op(*args, **kwargs)  # fake tensors: no random values to replay


def _run_as_aten(gm, example_inputs):
    """Run the partitioned graph op by op (the tracer sees every aten op). The RNG HOPs that
    carry a recomputed op's generator state (see _partition) have no rule for a dispatch mode:
    they run as plain calls here."""
    rng_prims = torch._prims.rng_prims
    for node in gm.graph.nodes:
        if node.target is rng_prims.run_and_save_rng_state:
            node.target = _run_and_save_rng_state
        elif node.target is rng_prims.run_with_rng_state:
            node.target = _run_with_rng_state
    gm.recompile()
    return make_boxed_func(gm.forward)


def partition_backend():
    from torch._inductor.decomposition import select_decomp_table

    return aot_autograd(fw_compiler=_run_as_aten, bw_compiler=_run_as_aten,
                        decompositions=select_decomp_table(), partition_fn=_partition,
                        keep_inference_input_mutations=True)


# Backward working set per block: live device bytes after every op of the backward, and where
# each block's backward starts (its output's gradient arrives) and ends (its input's gradient is
# complete), from tensor hooks set in the eager shell.
BACKWARD_LIVE: list[int] = []
BACKWARD_MARKS: list[tuple[str, int, int]] = []
_dispatch_with_origins = step.Tracker.__torch_dispatch__


def _dispatch_logging_backward(self, func, types_, args=(), kwargs=None):
    out = _dispatch_with_origins(self, func, types_, args, kwargs)
    if self.phase == "backward":
        BACKWARD_LIVE.append(self.current_bytes)
    return out


step.Tracker.__torch_dispatch__ = _dispatch_logging_backward


class Scoped(torch.nn.Module):
    """An eager shell around a (compiled) block: the tracer hooks it, and it marks where the
    block's backward starts and ends."""

    def __init__(self, inner: torch.nn.Module, index: int) -> None:
        super().__init__()
        self.inner = inner
        self.index = index

    def forward(self, x, *args, **kwargs):
        out = self.inner(x, *args, **kwargs)
        if torch.is_grad_enabled():
            out.register_hook(lambda g: BACKWARD_MARKS.append(
                ("start", self.index, len(BACKWARD_LIVE))))
            if x.requires_grad:
                x.register_hook(lambda g: BACKWARD_MARKS.append(
                    ("end", self.index, len(BACKWARD_LIVE))))
        return out


def _backward_working_sets(num_blocks: int) -> list[int | None]:
    """Per block: peak live bytes during its backward minus live bytes when it began (includes
    its parameter gradients and the recomputation under AC)."""
    starts = {i: at for kind, i, at in BACKWARD_MARKS if kind == "start"}
    ends = {i: at for kind, i, at in BACKWARD_MARKS if kind == "end"}
    out: list[int | None] = []
    for i in range(num_blocks):
        a, e = starts.get(i), ends.get(i)
        if a is None or e is None or not BACKWARD_LIVE:
            out.append(None)
            continue
        base = BACKWARD_LIVE[a - 1] if a else BACKWARD_LIVE[0]
        out.append(max(BACKWARD_LIVE[a:e + 1]) - base)
    return out


def trace(policy: str, micro_batch: int, seq_len: int, compiled: bool = True,
          rms_norm: str = "composite") -> dict:
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss

    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=mk.DIMS["vocab_size"]))
    info: dict = {}
    first_partition = len(PARTITIONS)

    def build():
        model, info["hidden"] = mk.build_model(seq_len, True)
        tokens = torch.randint(0, mk.DIMS["vocab_size"], (micro_batch, seq_len))
        labels = torch.randint(0, mk.DIMS["vocab_size"], (micro_batch, seq_len))
        mk.apply_policy(model, policy)  # torchtitan: AC first, then compile
        traced = mk.Traced(model)
        if compiled:
            torch._dynamo.reset()
            torch._dynamo.config.capture_scalar_outputs = True  # as apply_compile sets
            backend = partition_backend()
        shells = []
        for index, (layer_id, block) in enumerate(list(model.layers.named_children())):
            if compiled:
                block = torch.compile(block, backend=backend, fullgraph=True)
            shell = Scoped(block, index)
            model.layers.register_module(layer_id, shell)
            shells.append(shell)
        traced.blocks = torch.nn.ModuleList(shells)

        def loss(m, batch):
            pred = m(batch[0])
            return loss_fn(pred, batch[1], (batch[1] != IGNORE_INDEX).sum())[0]

        return step.StepJob(model=traced, batch=(tokens, labels), loss=loss,
                            enable_recompute=lambda t: None)

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = mk.TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    contexts = mk.norm_contexts(contexts, rms_norm)
    BACKWARD_LIVE.clear()
    BACKWARD_MARKS.clear()
    out = step.run_step(build, precision="bf16", recompute="full", optimizer="adamw",
                        device_type=device_type, contexts=contexts, on_phase_end=on_phase_end)
    d, tokens = mk.DIMS, micro_batch * seq_len
    parts = PARTITIONS[first_partition:]
    return {
        "policy": policy, "compiled": compiled, "rms_norm": rms_norm,
        "micro_batch_size": micro_batch,
        "seq_len": seq_len, "tokens": tokens,
        "dims": {"hidden": d["dim"], "intermediate": info["hidden"], "heads": d["n_heads"],
                 "kv_heads": d["n_kv_heads"], "head_dim": d["dim"] // d["n_heads"],
                 "vocab": d["vocab_size"], "layers": d["n_layers"]},
        "parameters_bytes": out["parameters_bytes"],
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "saved_width_per_layer_elements": [b / (tokens * 2)
                                           for b in out["activations_by_layer_bytes"]],
        "peak_forward_bytes": out["phases"]["forward"],
        "peak_backward_bytes": out["phases"]["backward"],
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "backward_working_set_by_layer_bytes": _backward_working_sets(d["n_layers"]),
        "saved_at_end_of_forward": marks["saved"],
        "partitions": len(parts),
        "partitioned_forward_saved": parts[0]["saved"] if parts else None,
        "partitioned_forward_saved_new_bytes": sum(s.get("bytes", 0) for s in parts[0]["saved"])
        if parts else None,
    }, parts


def _one(policy: str, norm: str, b: int, s: int, compiled: bool) -> tuple[dict, dict | None]:
    """One trace in a fresh process: rms_norm kernels registered by a previous trace and
    dynamo/AOT state change the compiled backward graph (not the forward's saved set) when
    traces share a process."""
    import subprocess

    res = subprocess.run(
        [sys.executable, __file__, "--case", policy, norm, str(b), str(s), str(int(compiled))],
        capture_output=True, text=True, check=True)
    line = [x for x in res.stdout.splitlines() if x.startswith("{")][-1]
    out = json.loads(line)
    return out["case"], out["graph"]


def main() -> None:
    if sys.argv[1:2] == ["--case"]:
        policy, norm, b, s, compiled = sys.argv[2:7]
        case, parts = trace(policy, int(b), int(s), compiled == "1", norm)
        graph = {"fw": parts[0]["fw_code"], "bw": parts[0]["bw_code"]} if parts else None
        print(json.dumps({"case": case, "graph": graph}))
        return
    cases, graphs = [], {}
    for policy in POLICIES:
        for norm in ("composite", "fused"):
            for b, s in SHAPES:
                for compiled in (False, True):
                    case, graph = _one(policy, norm, b, s, compiled)
                    cases.append(case)
                    if graph and (b, s) == SHAPES[0]:
                        graphs[f"{policy} {norm}"] = graph
                    print(policy, norm, b, s, compiled, case["saved_width_per_layer_elements"],
                          case["peak_backward_bytes"],
                          [w / (2 * case["tokens"]) for w in
                           case["backward_working_set_by_layer_bytes"]], flush=True)
    OUT.write_text(json.dumps({
        "provenance": {
            "torchtitan": "0.3.0", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<repo root>:<torchtitan-0.3.0 src>:<deps> python "
                       "tests/data/framework_traces/make_torchtitan_compile_traces.py",
            "device": "trainmem fake cuda (sm90), SDPA as flash (GQA native)",
            "backend": "aot_autograd + inductor decompositions + inductor partition_fn "
                       "(joint-graph passes + min-cut), graphs run as aten (no codegen)",
            "notes": [
                "rms_norm composite: the CPU build's decomposition on the fake device; fused: "
                "the CUDA kernel's saved set (input, rstd), trainmem trace/_norm.py "
                "gpu_rms_norm; a compiled block saves the same set with either (inductor "
                "decomposes _fused_rms_norm and its backward), only its backward graph differs",
                "backward_working_set_by_layer_bytes: peak live bytes while block k's backward "
                "runs minus live bytes when its output gradient arrives (parameter gradients "
                "and recomputation included); compiled: the partitioned backward run op by op "
                "(no inductor fusion), an upper bound on what inductor's kernels would hold",
                "each case in a fresh process",
                "activations_by_layer_bytes as in torchtitan_llama3_ac.json: storages made "
                "inside block k alive at the end of forward; a block's output that the next "
                "block (or the final norm) keeps is counted in block k",
                "partitioned_forward_saved: outputs of the partitioned forward graph past the "
                "user outputs, first block, first compile; 'input' marks a graph input "
                "(parameter, block input, rope cache) or a view of one; 'host': the CPU "
                "generator state FullAC's recomputed flash op carries (see _partition)",
                "joint_graph_constant_folding off (needs real tensors); real inductor on CPU "
                "real bf16 tensors gives the same no-AC saved set as this backend",
                "the loss and final norm are not compiled (torchtitan compiles the blocks "
                "only); graphs run op by op, so transient peaks are aten's, not inductor's",
            ],
        },
        "cases": cases,
        "graphs_first_shape": graphs,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
