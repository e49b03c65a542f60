"""Every Triton kernel the engine launches compiles for sm_80 and sm_90 without a GPU: no
register spills, shared memory within each architecture's per-block limit, and no
re-specialization when the per-step integers change.

``python -m cbbench.kernels.aot`` runs the engine's own launch code on small CPU tensors shaped
like the real ones (bf16/fp16/fp32; head dims 64 and 128; GQA groups 1, 4, 8; block sizes 16
and 256; prefill, decode and split-K tiles; the fused layer kernels at every preset's hidden and
intermediate size) and compiles each launch through Triton's JIT for the target (Triton ships
ptxas). It runs in subprocesses, one per architecture in parallel (each also compiles the extra
points of aot_split_points.py), because under
TRITON_INTERPRET (which tests/conftest.py sets) nothing can be compiled. Triton's disk cache
makes reruns fast. The kernel/shape/dtype matrix is printed in the test report's summary.
.ci/run runs this file a second time under Triton 3.6.0, the GPU image's version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("triton")

CAPS = (80, 90)
# Launch points beyond the library's matrix (the split-K kernel at block size 32 as a captured
# graph launches it), compiled by the same code in the process that compiles the matrix.
EXTRA_POINTS = Path(__file__).with_name("aot_split_points.py")
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
COMPILE_TIMEOUT_S = 900  # a cold cache on a busy 2-core machine; warm reruns take seconds
KERNELS = {
    "_paged_attention_kernel",
    "_packed_decode_kernel",
    "_split_decode_kernel",
    "_split_merge_kernel",
    "_store_kv_kernel",
    "_rope_kernel",
    "_rms_norm_kernel",
    "_silu_and_mul_kernel",
}


class _MatrixReport:
    """A pytest plugin that prints the compiled matrix in the terminal summary."""

    def __init__(self, results: dict[int, dict]) -> None:
        self.results = results

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        first = next(iter(self.results.values()))
        tr.section(f"Triton AOT matrix (triton {first['triton']}; regs / spill bytes / smem KiB)")
        by_point: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
        for cap, result in self.results.items():
            for row in result["rows"]:
                by_point[(row["kernel"], row["config"])][cap] = row
        header = f"{'kernel':<24}{'config':<34}" + "".join(f"{'sm_' + str(c):>18}" for c in CAPS)
        tr.write_line(header)
        for (kernel, config), per_cap in sorted(by_point.items()):
            cells = "".join(
                f"{r['regs']:>7} {r['spill_bytes']:>3} {r['smem'] / 1024:>6.1f}"
                for r in (per_cap[c] for c in CAPS)
            )
            tr.write_line(f"{kernel:<24}{config:<34}{cells}")
        for cap, result in self.results.items():
            rows = result["rows"]
            tr.write_line(
                f"sm_{cap}: {len(rows)} launches, {sum(r['compiled'] for r in rows)} distinct "
                f"compiles in {result['seconds']} s; max regs {max(r['regs'] for r in rows)}, "
                f"max smem {max(r['smem'] for r in rows) / 1024:.1f} KiB "
                f"(limit {SMEM_LIMIT[cap] // 1024} KiB)"
            )


def _finish(proc: subprocess.Popen, group: list[subprocess.Popen]) -> str:
    """``proc``'s output; on a timeout every compile of ``group`` is killed first (a timed-out
    ``communicate`` leaves them compiling on, starved, long after the test has failed)."""
    try:
        return proc.communicate(timeout=COMPILE_TIMEOUT_S)[0]
    except subprocess.TimeoutExpired:
        for other in group:
            other.kill()
            other.communicate()
        raise


@pytest.fixture(scope="module")
def aot(tmp_path_factory, request) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when it is unset
    # One process per architecture, in parallel: the library's matrix, then the extra points
    # (tests/kernels/aot_split_points.py --with-matrix), on one torch and Triton start-up.
    procs = {
        cap: subprocess.Popen(
            [sys.executable, str(EXTRA_POINTS), "--cap", str(cap), "--with-matrix", str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for cap in CAPS
    }
    results = {}
    for cap, proc in procs.items():
        output = _finish(proc, list(procs.values()))
        assert proc.returncode == 0, f"sm_{cap} compile failed:\n{output[-4000:]}"
        results[cap] = json.loads((out / f"sm_{cap}.json").read_text())
        results[cap]["rows"] += json.loads((out / f"extra_sm_{cap}.json").read_text())["rows"]
    request.config.pluginmanager.register(_MatrixReport(results), "triton-aot-matrix")
    return results


@pytest.mark.timeout(COMPILE_TIMEOUT_S + 60)
def test_no_spills_and_smem_within_limits(aot):
    for cap, result in aot.items():
        assert result["smem_limit"] == SMEM_LIMIT[cap]
        for row in result["rows"]:
            where = f"sm_{cap} {row['kernel']} [{row['config']}]"
            assert row["spill_bytes"] == 0, f"{where} spills {row['spill_bytes']} bytes"
            assert 0 < row["regs"] <= 255, where
            assert row["smem"] <= SMEM_LIMIT[cap], f"{where} needs {row['smem']} B shared"


def test_matrix_covers_every_kernel_dtype_shape(aot):
    for cap, result in aot.items():
        rows = result["rows"]
        assert {r["kernel"] for r in rows} == KERNELS, f"sm_{cap}"
        configs = {r["config"] for r in rows if r["kernel"] == "_paged_attention_kernel"}
        for dtype in ("bf16", "fp16", "fp32"):
            for head_dim in (64, 128):
                for gqa in (1, 4, 8):
                    for phase in ("prefill", "unified-decode"):
                        assert f"{dtype} d{head_dim} gqa{gqa} bs16 {phase}" in configs
                    # The GQA-packed kernel, both ways, from head dim 128 (PACKED_MIN_HEAD_DIM);
                    # a narrower head's pure decode keeps the unified kernel.
                    kernel = "_packed_decode_kernel" if head_dim >= 128 else "_paged_attention_kernel"
                    for phase in ("decode", "cores-decode"):
                        packed = f"{dtype} d{head_dim} gqa{gqa} bs16 {phase}"
                        assert any(r["kernel"] == kernel and r["config"] == packed
                                   for r in rows), f"sm_{cap} {kernel} {packed}"  # fmt: skip
                    for kernel in ("_split_decode_kernel", "_rope_kernel"):
                        point = f"{dtype} d{head_dim} gqa{gqa} bs16"
                        assert any(
                            r["kernel"] == kernel and r["config"].startswith(point) for r in rows
                        ), f"{kernel} {point}"
        assert "bf16 d128 gqa4 bs256 prefill" in configs
        # The compilation counter (kernels.compilation_counter) saw the compiles: each kernel's
        # first launch in the fresh process is a new compile.
        first = {}
        for r in rows:
            first.setdefault(r["kernel"], r)
        assert all(r["compiled"] for r in first.values()), f"sm_{cap}: {first}"


def test_per_step_integers_never_respecialize(aot):
    """The attention kernels launched with num_reqs / block-table width / split count at 1,
    16, 17 and 32 (values Triton specializes on unless told not to) compile nothing new."""
    for cap, result in aot.items():
        rows = result["specialization_rows"]
        assert {r["kernel"] for r in rows} == {
            "_paged_attention_kernel", "_split_decode_kernel", "_split_merge_kernel",
            "_packed_decode_kernel",
        }  # fmt: skip
        seen: set[str] = set()
        for row in rows:
            if row["kernel"] in seen:
                assert not row["compiled"], f"sm_{cap} {row['kernel']} recompiled: {row['config']}"
            seen.add(row["kernel"])


def test_split_k_compiles_at_block_size_32_as_a_graph_launches_it(aot):
    """The split kernel at the second block size the CPU suite proves (tests/kernels/
    aot_split_points.py), every dtype, head dim and GQA group; no spills by the test above."""
    for cap, result in aot.items():
        configs = {r["config"] for r in result["rows"] if r["kernel"] == "_split_decode_kernel"}
        for dtype in ("bf16", "fp16", "fp32"):
            for head_dim in (64, 128):
                for gqa in (1, 4, 8):
                    point = f"{dtype} d{head_dim} gqa{gqa} bs32 split-k graph"
                    assert point in configs, f"sm_{cap} {point}"
