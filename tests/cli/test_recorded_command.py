"""The command a result file records (run, capacity, forward): the process's argv with literal
header values and a URL's credentials and query removed; a variable's name is kept."""

from __future__ import annotations

from cbbench.bench.runner import recorded_command


def test_secrets_are_removed_and_variable_names_kept():
    argv = ["capacity", "--endpoint", "http://u:sk-1@h:8000/v1?key=sk-2",
            "--header", "X-Api-Key=sk-3", "--header=Authorization=env:TOKEN",
            "--gpu-metrics=http://a:sk-4@h:9400/metrics", "--slo", "ttft:500"]
    assert recorded_command(argv) == (
        "cbbench capacity --endpoint http://h:8000/v1 --header 'X-Api-Key=<redacted>' "
        "--header=Authorization=env:TOKEN --gpu-metrics=http://h:9400/metrics --slo ttft:500")


def test_a_flag_without_its_value_is_kept_as_given():
    assert recorded_command(["run", "--header"]) == "cbbench run --header"


def test_the_recorded_command_runs_again_as_it_was_given():
    """A value with a space (a --label, a path) was written bare: `--label my run` re-ran as
    "Got unexpected extra argument(s)". The command is a shell's: it splits back to the argv."""
    import shlex

    argv = ["run", "--label", "my run", "--output", "a b.json", "--slo", "ttft=500"]
    assert shlex.split(recorded_command(argv)) == ["cbbench", *argv]
    assert shlex.split(recorded_command(["run", "--header", "K=v"])) == \
        ["cbbench", "run", "--header", "K=<redacted>"]
