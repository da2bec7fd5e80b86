"""`trainmem completion SHELL` (issue 27 item 4): the shell's script, printed offline, and the
answers it asks trainmem for: commands, options, fixed choices and the catalogue's names."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainmem.cli import main

AS_TRAINMEM = (
    "import sys; sys.argv[0] = 'trainmem'; from trainmem.cli import main; sys.exit(main())"
)
"""The CLI under the console script's name (the completion variable is named after it)."""


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish", "powershell"])
def test_the_script_is_printed_and_calls_trainmem_back(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "trainmem" in script and "_TRAINMEM_COMPLETE" in script


def test_bash_script_registers_the_completion_function(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "_TRAINMEM_COMPLETE=complete_bash" in script
    assert script.rstrip().endswith("complete -o default -F _trainmem_completion trainmem")


def test_an_unknown_shell_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "tcsh"]) == 2
    err = capsys.readouterr().err
    assert err == "error: shell: unknown value 'tcsh'; allowed: bash, zsh, fish, powershell\n"


def _answers(line: str) -> list[str]:
    """What bash's completion gets for the command line `line` (the last word is completed)."""
    words = line.split(" ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEM_")}
    env |= {"_TRAINMEM_COMPLETE": "complete_bash", "COMP_WORDS": line}
    env["COMP_CWORD"] = str(len(words) - 1)
    done = subprocess.run(
        [sys.executable, "-c", AS_TRAINMEM], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("trainmem rec", ["recommend"]),
        ("trainmem estimate --fra", ["--framework"]),
        ("trainmem estimate --fr", ["--freeze-vision", "--framework"]),
        ("trainmem estimate --framework me", ["megatron"]),
        ("trainmem sweep --method ", ["exhaustive", "optuna"]),
        ("trainmem completion ", ["bash", "zsh", "fish", "powershell"]),
    ],
)
def test_commands_options_and_choices_complete(line: str, expected: list[str]) -> None:
    assert _answers(line) == expected


def test_model_gpu_and_optimizer_names_complete() -> None:
    assert "llama-3.1-8b" in _answers("trainmem estimate --model llama-3.1")
    gpus = _answers("trainmem fit --gpu h1")
    assert "h100-sxm-80gb" in gpus and all(g.startswith("h1") for g in gpus)
    assert "adamw-8bit" in _answers("trainmem sweep --optimizer adamw")
