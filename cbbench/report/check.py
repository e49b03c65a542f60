"""What `cbbench report` reads from a result, checked before it draws: a result that passes the
loader (schema version, config and summary sections) may still hold a `requests` that is a
string or iteration records without their fields, and each plot crashed on its own way
(AttributeError, ValueError, TypeError). Here a field a plot reads must have the kind the plot
needs; the first one that does not is one line naming the file, the record and the field.
"""

from __future__ import annotations

from pathlib import Path

from cbbench.errors import UsageError
from cbbench.finite import is_finite

# Iteration fields the plots read (report/plots.py): finite numbers, each required.
ITERATION_NUMBERS = (
    "index", "start_s", "num_prefill_tokens", "num_decode_tokens", "token_budget",
    "num_prefill_reqs", "num_decode_reqs", "num_running", "num_waiting", "num_preempted",
    "kv_blocks_used", "kv_blocks_total",
)
ITERATION_OPTIONAL_NUMBERS = ("achieved_bw_gbps",)
REQUEST_NUMBERS = ("id", "intended_start_s")
REQUEST_OPTIONAL_NUMBERS = ("ttft_ms", "tpot_ms", "e2el_ms", "queue_ms")
REQUEST_OPTIONAL_LISTS = ("itl_ms", "token_times_s")
CONFIG_OPTIONAL_TEXT = ("scheduler", "label")
CONFIG_OPTIONAL_NUMBERS = ("max_num_seqs",)
SAMPLE_OPTIONAL_NUMBERS = ("t_s", "dram_bw_util_pct")


def _kind(v) -> str:
    return "null" if v is None else f"a {type(v).__name__}"


class _Checker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, what: str) -> None:
        raise UsageError(f"{self.path}: {where} {what}: cannot plot it")

    def records(self, obj: dict, key: str) -> list[dict]:
        if key not in obj:  # a summary-only result
            return []
        items = obj[key]
        if not isinstance(items, list):
            self.fail(f"'{key}'", f"is {_kind(items)}, not a list of records")
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                self.fail(f"'{key}'[{i}]", f"is {_kind(it)}, not a record")
        return items

    def numbers(self, rec: dict, where: str, required=(), optional=()) -> None:
        for key in required:
            if key not in rec:
                self.fail(where, f"has no '{key}'")
        for key in (*required, *optional):
            v = rec.get(key)
            if (v is not None or key in required) and not is_finite(v):
                self.fail(where, f"has '{key}' = {v!r}, not a finite number")

    def number_lists(self, rec: dict, where: str, keys) -> None:
        for key in keys:
            v = rec.get(key)
            if v is not None and not (isinstance(v, list) and all(is_finite(x) for x in v)):
                self.fail(where, f"has '{key}' that is not a list of finite numbers")

    def section(self, obj: dict, key: str) -> dict:
        v = obj.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.fail(f"'{key}'", f"is {_kind(v)}, not an object")
        return v


def check_report_input(result: dict, path: Path) -> None:
    """Raise UsageError at the first field a plot would read that has the wrong kind."""
    c = _Checker(path)
    for i, it in enumerate(c.records(result, "iterations")):
        c.numbers(it, f"iteration {i}", ITERATION_NUMBERS, ITERATION_OPTIONAL_NUMBERS)
    for i, r in enumerate(c.records(result, "requests")):
        where = f"request {i}"
        c.numbers(r, where, REQUEST_NUMBERS, REQUEST_OPTIONAL_NUMBERS)
        c.number_lists(r, where, REQUEST_OPTIONAL_LISTS)
    config = c.section(result, "config")
    for key in CONFIG_OPTIONAL_TEXT:
        if config.get(key) is not None and not isinstance(config[key], str):
            c.fail("config", f"has '{key}' = {config[key]!r}, not text")
    c.numbers(config, "config", optional=CONFIG_OPTIONAL_NUMBERS)
    spec = c.section(config, "gpu_spec")
    c.numbers(spec, "config.gpu_spec", optional=("hbm_bandwidth",))
    telemetry = c.section(result, "telemetry")
    for i, s in enumerate(c.records(telemetry, "samples")):
        drawn = s.get("dram_bw_util_pct") is not None  # its time is read then
        c.numbers(s, f"telemetry sample {i}", ("t_s",) if drawn else (), SAMPLE_OPTIONAL_NUMBERS)
