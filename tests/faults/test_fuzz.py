"""The long fuzz run's command line, at a one-second scale."""

from __future__ import annotations

from tools.chaos.fuzz import main, run_hypothesis


def test_a_mutation_run_counts_inputs_and_finds_nothing_new_in_checkpoints() -> None:
    run = run_hypothesis("checkpoints", 1.0, seed=3)
    assert run.inputs and run.inputs > 100
    assert (run.known, run.new) == (0, 0)


def test_the_command_exits_0_when_nothing_new_is_found(capsys) -> None:
    assert main(["--engine", "hypothesis", "--target", "control-datagrams", "--seconds", "1"]) == 0
    assert "== control-datagrams: 0 known findings, 0 new" in capsys.readouterr().out
