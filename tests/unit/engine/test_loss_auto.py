"""`--loss auto`: each framework's own loss (FrameworkSpec.loss), resolved before the engine and
shown resolved; every explicit loss is itself."""

from __future__ import annotations

import numpy as np

from trainmem.engine import FRAMEWORK_SPECS, FRAMEWORKS, LOSSES, resolved_loss
from trainmem.engine._frameworks import loss_policy


def test_auto_resolves_per_framework() -> None:
    assert resolved_loss("torchtitan", "auto") == "chunked-head"
    for name in FRAMEWORKS:
        if name != "torchtitan":  # every other framework keeps its old default
            assert resolved_loss(name, "auto") == "full"
        for loss in LOSSES:
            if loss != "auto":
                assert resolved_loss(name, loss) == loss


def test_codes_resolve_as_names() -> None:
    fw = np.arange(len(FRAMEWORKS))
    auto = np.full_like(fw, LOSSES.index("auto"))
    got = loss_policy(fw, auto)
    assert [LOSSES[g] for g in got] == [FRAMEWORK_SPECS[n].loss for n in FRAMEWORKS]
    chunked = np.full_like(fw, LOSSES.index("chunked"))
    assert (loss_policy(fw, chunked) == chunked).all()


def test_older_codes_keep_their_numbers() -> None:
    assert LOSSES[:3] == ("full", "chunked", "chunked-output")


def test_the_report_shows_the_resolved_loss() -> None:
    from trainmem.report._estimate import training_config

    assert training_config(None, {"framework": "torchtitan"})["loss"] == "chunked-head"
    assert training_config(None, {"framework": "hf"})["loss"] == "full"
    assert training_config(None, {"framework": "torchtitan", "loss": "full"})["loss"] == "full"
