"""A real training step on the CPU with every storage tracked: bytes per phase, exactly.

The same measurement as `trainmem trace` (sweep/_trace.py), on real tensors instead of fake ones:
for small models only, where a reference without any fake-tensor machinery is wanted. Needs
torch and transformers. Used to record tests/data/moe_cpu_trace.json.

Run: python -m bench.cpu_trace CONFIG_JSON MICRO_BATCH SEQ_LEN bf16|fp32 none|full
Prints one JSON object: params, states, activations and the peak of each phase.
"""

from __future__ import annotations

import json
import sys

from trainmem.trace._core import trace_step


def main() -> None:
    config, micro, seq, precision, recompute = sys.argv[1:6]
    got = trace_step(
        json.loads(config),
        micro_batch_size=int(micro),
        seq_len=int(seq),
        precision=precision,
        recompute=recompute,
        attention="flash",
        optimizer="adamw",
        device="cpu",
        fake=False,
    )
    print(
        json.dumps(
            {
                "params": got["parameters_bytes"],
                "states": got["optimizer_states_bytes"],
                "activations": got["activations_bytes"],
                **{f"peak_{phase}": value for phase, value in got["phases"].items()},
            }
        )
    )


if __name__ == "__main__":
    main()
