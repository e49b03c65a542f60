"""What `cbbench calibrate` reads: run results (plain or gzip-compressed JSON) and the GPU
check's decode microbenchmark (``decode.json`` from ``tests/gpu/bench_gpu.py decode``).

A microbenchmark row is a decode step at one batch size and one context, timed over many
steps: the fit's only sight of batch sizes a run did not reach (a run at --max-num-seqs 32
never shows batch 256). Each row becomes one iteration record, the shape a real decode step
of that batch has (every request's context in the cache, one new token each), timed at the
row's median step, weighed as the steps it was timed over. Rows are taken from the
configuration the runs used (CUDA graphs, fused kernels, attention backend), so the fit
never mixes a graph-captured step with an eager one.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from cbbench.errors import UsageError
from cbbench.finite import is_finite

if TYPE_CHECKING:
    from cbbench.schema.run import RunResult

# A compressed file may expand past any size: read at most this much of it (a run of 100k
# requests' iteration records is ~200 MB).
MAX_DECOMPRESSED_BYTES = 1 << 30
BENCH_COMMAND = "decode"  # args.cmd of bench_gpu.py's decode microbenchmark
BENCH_ROLE = "main"  # rows of the engine's own backends (not the torch reference's)
# The step statistic a row is timed by: the median is robust to a stray slow step.
BENCH_STAT = "p50"
MAX_BENCH_BATCH = 1 << 20
MAX_BENCH_CONTEXT = 1 << 24


@dataclass(frozen=True)
class BenchRow:
    batch_size: int
    context: int
    step_s: float
    steps: int  # timed steps behind the median: the row's weight in the fit


@dataclass(frozen=True)
class DecodeBench:
    """The rows of one decode microbenchmark that match the runs' configuration."""

    file: str
    device: str  # the GPU spec name
    device_name: str
    dtype: str
    model_config: dict
    rows: tuple[BenchRow, ...]
    selection: dict  # the configuration the rows were chosen by


class _Fields(BaseModel):
    """A microbenchmark object's fields decode_bench reads, as written: each is checked
    where it is read, with the message that names it."""

    model_config = ConfigDict(extra="allow")


class BenchArgs(_Fields):
    cmd: Any = None
    dtype: Any = None
    steps: Any = None


class BenchRowIn(_Fields):
    """One row of decode.json (tests/gpu/bench_gpu.py decode)."""

    role: Any = None
    step_ms: Any = None
    batch_size: Any = None
    context: Any = None


class BenchFile(_Fields):
    # model_config (the model's shape) stays an extra field: pydantic reserves the name.
    gpu_spec: Any = None
    args: Any = None
    rows: Any = None
    env: Any = None


def read_json_input(path: Path) -> object:
    """A JSON file's value, gzip-compressed or not; one line (UsageError) when it cannot be."""
    from cbbench.schema import read_json_file

    if path.suffix != ".gz":
        return read_json_file(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read(MAX_DECOMPRESSED_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"result file not found: {path}") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    if len(raw) > MAX_DECOMPRESSED_BYTES:
        raise UsageError(f"{path} expands past {MAX_DECOMPRESSED_BYTES >> 20} MiB: not a result")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{path} is not valid JSON ({str(e)[:200]})") from None


def is_decode_bench(data: object) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("args"), dict)
            and data["args"].get("cmd") == BENCH_COMMAND and "rows" in data)


def read_input(path: Path) -> tuple[str, RunResult | dict]:
    """("run", a checked run result) or ("bench", a decode microbenchmark's dict)."""
    from cbbench.schema import parse_run

    data = read_json_input(path)
    if is_decode_bench(data):
        assert isinstance(data, dict)
        return "bench", data
    return "run", parse_run(data, path)


def _int(v: object, top: int, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
        raise UsageError(f"{where}: expected an integer in [1, {top}], got {v!r}")
    return v


def decode_bench(where: str, data: dict, selection: dict) -> DecodeBench:
    """The rows of ``data`` run as ``selection`` says ({"graphs", "fused",
    "attention_backend"}; a None value: any), checked field by field."""
    from cbbench.engine.sim.gpu_specs import get_gpu_spec

    bench = BenchFile.model_validate(data)
    spec = bench.gpu_spec
    name = spec.get("name") if isinstance(spec, dict) else None  # a GpuSpec's dict
    if not isinstance(name, str):
        raise UsageError(f"{where}: a decode microbenchmark without a gpu_spec (a CPU run?): "
                         "it calibrates no GPU profile")
    try:
        device = get_gpu_spec(name).name
    except ValueError as e:
        raise UsageError(f"{where}: gpu_spec.name: {e}") from None
    args = BenchArgs.model_validate(bench.args)  # an object: is_decode_bench
    dtype = args.dtype
    if not isinstance(dtype, str):
        raise UsageError(f"{where}: args.dtype is missing")
    model = (bench.model_extra or {}).get("model_config")
    if not isinstance(model, dict):
        raise UsageError(f"{where}: no model_config")
    rows_in = bench.rows
    if not isinstance(rows_in, list):
        raise UsageError(f"{where}: 'rows' is not a list")
    steps = _int(args.steps, 1 << 20, f"{where}: args.steps")
    rows = []
    for k, raw in enumerate(rows_in):
        w = f"{where}: rows[{k}]"
        if not isinstance(raw, dict):
            raise UsageError(f"{w} is not an object")
        row = BenchRowIn.model_validate(raw)
        if (row.role if "role" in row.model_fields_set else BENCH_ROLE) != BENCH_ROLE:
            continue
        # The selection's keys are the rows' own (graphs, fused, attention_backend).
        if any(v is not None and raw.get(key) != v for key, v in selection.items()):
            continue
        stat = row.step_ms
        t = stat.get(BENCH_STAT) if isinstance(stat, dict) else None
        if not is_finite(t) or t <= 0:
            raise UsageError(f"{w}: step_ms.{BENCH_STAT} must be a time > 0 ms, got {t!r}")
        rows.append(BenchRow(_int(row.batch_size, MAX_BENCH_BATCH, f"{w}.batch_size"),
                             _int(row.context, MAX_BENCH_CONTEXT, f"{w}.context"),
                             float(t) / 1e3, steps))
    if not rows:
        chosen = ", ".join(f"{k}={v}" for k, v in selection.items() if v is not None)
        raise UsageError(f"{where}: no decode rows run as the results were ({chosen})")
    env = bench.env if isinstance(bench.env, dict) else {}
    return DecodeBench(Path(where).name, device, str(env.get("device_name") or device), dtype,
                       model, tuple(rows), selection)
