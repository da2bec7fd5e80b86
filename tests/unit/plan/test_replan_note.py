"""A launch format that searches another framework than the summary says so: one line on
stderr naming what changed and `replanned_for_format` in the JSON (issue 27 item 1: `recommend
--format deepspeed` re-planned zero 2 -> 3 and accumulation 16 -> 8 with no note)."""

from __future__ import annotations

import json

import pytest

from trainmem.cli import main
from trainmem.plan import replan_line, replan_note, replans


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_which_formats_replan() -> None:
    assert replans("deepspeed", None) and replans("accelerate", None)
    assert replans("torchtitan", None)
    assert not replans("torchrun", None) and not replans("slurm", None)
    assert not replans("json", None) and not replans(None, None)
    assert not replans("deepspeed", "deepspeed")  # the framework given: no re-plan


def test_the_note_names_what_changed() -> None:
    before = {"framework": "megatron", "zero": 2, "cp": 2, "grad_accum_steps": 16, "tp": 1}
    after = {"framework": "deepspeed", "zero": 3, "cp": 1, "grad_accum_steps": 8, "tp": 1}
    note = replan_note(before, after, "deepspeed")
    assert note == {
        "format": "deepspeed",
        "changed": {
            "framework": ["megatron", "deepspeed"],
            "cp": [2, 1],
            "zero": [2, 3],
            "grad_accum_steps": [16, 8],
        },
    }
    assert replan_line(note) == (
        "note: --format deepspeed plans for deepspeed, not the summary's megatron: "
        "cp 2 -> 1, zero 2 -> 3, accumulation 16 -> 8"
    )


@pytest.mark.parametrize("fmt", ["deepspeed", "torchtitan"])
def test_recommend_says_a_replan_on_stderr_and_in_the_json(fmt: str, capsys) -> None:
    summary_plan = json.loads(_run(["recommend", "--json"], capsys)[0])
    out, err = _run(["recommend", "--format", fmt], capsys)
    (line,) = err.splitlines()
    assert line.startswith(f"note: --format {fmt} plans for ")
    assert "not the summary's megatron" in line
    report = json.loads(_run(["recommend", "--format", fmt, "--json"], capsys)[0])
    note = report["replanned_for_format"]
    assert note["format"] == fmt and note["changed"]["framework"][0] == "megatron"
    assert report["framework"] == note["changed"]["framework"][1] != "megatron"
    for field, (before, after) in note["changed"].items():
        assert summary_plan[field] == before and report[field] == after
    assert "replanned_for_format" not in summary_plan


def test_no_note_where_the_format_plans_the_summary_s_framework(capsys) -> None:
    out, err = _run(["recommend", "--format", "torchrun"], capsys)
    assert err == "" and out
    _, err = _run(["recommend", "--format", "deepspeed", "--framework", "deepspeed"], capsys)
    assert err == ""
