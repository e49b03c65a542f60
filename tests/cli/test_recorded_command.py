"""The command a result file records (run, capacity, forward): the process's argv with literal
header values and a URL's credentials and query removed; a variable's name is kept."""

from __future__ import annotations

from cbbench.bench.runner import recorded_command


def test_secrets_are_removed_and_variable_names_kept():
    argv = ["capacity", "--endpoint", "http://u:sk-1@h:8000/v1?key=sk-2",
            "--header", "X-Api-Key=sk-3", "--header=Authorization=env:TOKEN",
            "--gpu-metrics=http://a:sk-4@h:9400/metrics", "--slo", "ttft:500"]
    assert recorded_command(argv) == (
        "cbbench capacity --endpoint http://h:8000/v1 --header X-Api-Key=<redacted> "
        "--header=Authorization=env:TOKEN --gpu-metrics=http://h:9400/metrics --slo ttft:500")


def test_a_flag_without_its_value_is_kept_as_given():
    assert recorded_command(["run", "--header"]) == "cbbench run --header"
