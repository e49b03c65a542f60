"""Every JSON file a user names is read by one capped reader (engine/json_file.py): a device
profile, a result too large for memory, a tokenizer_config.json that is a device. Before it,
`--gpu-profile /dev/zero` was a MemoryError traceback, a profile nested 100k brackets deep a
RecursionError, a sparse result file larger than memory was read until the OOM killer came, and
a tokenizer_config.json linked to /dev/zero likewise.

The cases that read without end run in a child whose memory is capped, so a regression fails the
test instead of eating the host.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CliOutcome, cli_in_process, invoke_app

from cbbench.engine.json_file import read_json
from cbbench.engine.memory_check import available_host_bytes
from cbbench.schema.base import to_dict

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--num-requests", "2"]
MEMORY_CAP_BYTES = 4 << 30
NESTED = "[" * 100_000 + "]" * 100_000
BIG_INT = "1" * 5000
needs_dev_zero = pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *argv], capture_output=True, text=True, timeout=120,
                          preexec_fn=_cap_memory, cwd=cwd, env=dict(os.environ, COLUMNS="200"))


def _one_line(proc: subprocess.CompletedProcess | CliOutcome, *texts: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr[-2000:]
    for t in texts:
        assert t in lines[0], (t, lines[0])


@pytest.mark.parametrize("content", ["dev-zero", "nested", "big-int", "folder"])
def test_a_gpu_profile_that_is_not_json_is_one_line(tmp_path, content):
    if content == "dev-zero":
        if not Path("/dev/zero").exists():
            pytest.skip("needs /dev/zero")
        path = Path("/dev/zero")
    elif content == "folder":
        path = tmp_path
    else:
        path = tmp_path / "profile.json"
        path.write_text(NESTED if content == "nested" else '{"version": ' + BIG_INT + "}")
    argv = [*SIM, "--gpu-profile", str(path), "--output", str(tmp_path / "r.json")]
    # Only /dev/zero reads without end: its case runs in the memory-capped child. The others are
    # a bounded file or a folder, refused the same way by the console script's entry in this
    # process (helpers.cli_in_process; test_bad_input holds it to a real process's bytes).
    proc = _cli(argv, tmp_path) if content == "dev-zero" else \
        cli_in_process(argv, cwd=tmp_path, env={"COLUMNS": "200"})
    _one_line(proc, "--gpu-profile", str(path))
    assert not (tmp_path / "r.json").exists()


def _sparse_beyond_memory(tmp_path: Path) -> Path:
    available = available_host_bytes()
    if available is None:
        pytest.skip("the memory available is unknown here")
    path = tmp_path / "huge.json"
    try:
        with open(path, "wb") as f:
            # Twice memory: ten times the limit, whatever other processes free meanwhile.
            f.truncate(2 * available)  # sparse: no disk used
    except OSError as e:
        pytest.skip(f"cannot make a sparse file here: {e}")
    return path


@pytest.mark.parametrize("command", ["gate", "report"])
def test_a_result_file_beyond_memory_is_refused_before_it_is_read(tmp_path, command):
    huge = _sparse_beyond_memory(tmp_path)
    argv = {"gate": ["gate", str(huge), "--baseline", str(huge)],
            "report": ["report", str(huge), "--out", str(tmp_path / "out")]}[command]
    _one_line(_cli(argv, tmp_path), str(huge), "of memory to read")


def test_the_reader_names_each_problem(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": [1, 2.5, "x"]}')
    assert read_json(tmp_path / "ok.json", "thing") == {"a": [1, 2.5, "x"]}
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    cases = {
        tmp_path / "missing.json": "thing not found",
        tmp_path: "Is a directory",
        tmp_path / "big.json": "holds more than",
    }
    for path, text in cases.items():
        with pytest.raises(ValueError, match=text):
            read_json(path, "thing", max_bytes=1000)
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ValueError, match="cannot read thing"):
        read_json(tmp_path / "latin1.json", "thing")


@needs_dev_zero
def test_a_tokenizer_config_linked_to_dev_zero_means_no_template(tmp_path):
    """The chat-template lookup beside --tokenizer read its tokenizer_config.json whole."""
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").symlink_to("/dev/zero")
    code = ("import sys; from cbbench.load.chat_template import load_chat_template; "
            "print(load_chat_template(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tokenizer.json")],
                          capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-2000:]


# ---- a result given to --replay: its records and config, of their kinds -----------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:

    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    spec = run_spec(workload="sharegpt", num_requests=3, engine=EngineArgs(engine="sim"))
    return to_dict(execute_run(spec))


REPLAY_CASES = {  # (section, key, value, text in the error); request keys edit record 0.
    # Fields the typed result schema (cbbench/schema) types are refused there first, by path.
    "record-an-int": ("requests", None, [1], "requests.0: Input should be a valid dictionary"),
    "output-tokens-text": ("request", "output_tokens", "x", "requests.0.output_tokens: Input should be a valid integer"),
    "output-tokens-float": ("request", "output_tokens", 1.5, "requests.0.output_tokens: Input should be a valid integer"),
    "prompt-tokens-negative": ("request", "prompt_tokens", -5, "prompt_tokens -5"),
    "prompt-tokens-absent": ("request", "prompt_tokens", KeyError, "prompt_tokens None"),
    "id-text": ("request", "id", "x", "id 'x'"),
    "priority-text": ("request", "priority", "x", "requests.0.priority: Input should be a valid integer"),
    "seed-text": ("config", "seed", "x", "config.seed: Input should be a valid integer"),
    "rate-text": ("config", "request_rate", "x", "request_rate 'x'"),
    "max-num-seqs-text": ("config", "max_num_seqs", "x", "--max-num-seqs must be an integer"),
    "block-size-bool": ("config", "block_size", True, "--block-size must be an integer"),
    "swap-space-text": ("config", "swap_space", "x", "--swap-space must be a number"),
    "model-a-list": ("config", "model", [1], "config.model: Input should be a valid string"),
    "prefix-caching-text": ("config", "enable_prefix_caching", "x", "true or false"),
}


@pytest.mark.parametrize("case", sorted(REPLAY_CASES))
def test_a_replayed_result_with_fields_of_the_wrong_kind_is_one_line(tmp_path, recorded, case):
    """Each was an int() ValueError, a KeyError, an AttributeError or a TypeError from the
    range check (EngineArgs checked ranges, not kinds) before."""
    import copy
    import json

    section, key, value, text = REPLAY_CASES[case]
    r = copy.deepcopy(recorded)
    target = r["requests"][0] if section == "request" else r["config"]
    if section == "requests":
        r["requests"] = value
    elif value is KeyError:
        del target[key]
    else:
        target[key] = value
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(r))
    # The app's click command built once for the module's cases (helpers.invoke_app).
    res = invoke_app(["run", "--replay", str(p), "--engine", "sim", "--output",
                      str(tmp_path / "out.json")], env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1, res.stderr
    assert err[0].startswith(f"cbbench: error: {p}") and text in err[0], err[0]
    assert not (tmp_path / "out.json").exists()


def test_engine_args_check_kinds_not_only_ranges():
    from cbbench.engine.args import EngineArgs, EngineArgsError

    for bad in ({"max_num_seqs": "8"}, {"block_size": 16.0}, {"chunked_prefill": 1},
                {"gpu_memory_utilization": "0.9"}, {"batching": None}):
        with pytest.raises(EngineArgsError):
            EngineArgs(engine="sim", **bad).validate()
    EngineArgs(engine="sim", swap_space=4, gpu_memory_utilization=1).validate()  # ints for floats


# ---- CSV traces: read as a stream --------------------------------------------------------------
def test_a_csv_trace_larger_than_memory_is_read_as_a_stream(tmp_path):
    """An Azure trace whose (sparse) tail is 8 GiB of NULs: the whole file was read into memory
    (a MemoryError traceback under the child's 4 GiB cap); now the rows stream and the NUL line
    is refused by the line cap."""
    from cbbench.load.traces import AZURE_COLUMNS

    trace = tmp_path / "az.csv"
    trace.write_text(",".join(AZURE_COLUMNS) + "\n2023-11-16 18:15:46.6805900,374,44\n")
    try:
        os.truncate(trace, 8 << 30)
    except OSError as e:
        pytest.skip(f"cannot make a sparse file here: {e}")
    _one_line(_cli(["workloads", "show", str(trace)], tmp_path), f"{trace}:3", "longer than")


def test_a_csv_trace_with_a_bom_and_crlf_still_loads(tmp_path):
    from cbbench.load.traces import AZURE_COLUMNS, load_azure

    rows = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:47.0000000,10,2"]
    trace = tmp_path / "az.csv"
    trace.write_bytes(("\ufeff" + ",".join(AZURE_COLUMNS) + "\r\n" + "\r\n".join(rows) + "\r\n")
                      .encode())
    w = load_azure(trace)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(374, 44), (10, 2)]


# ---- numbers a server sends back ----------------------------------------------------------------
@pytest.mark.parametrize("bad", [-5, 10**30, True, 2.0, "3"])
def test_a_usage_count_that_is_not_a_count_is_ignored(bad):
    """A server's `completion_tokens: -5` gave the run a negative output throughput, 10**30 one
    of 7e31 tok/s, and `true` was stored as the count: such a usage is treated as missing (the
    count falls back to the stream's events), as is such a prompt_tokens."""
    from cbbench.analysis.records import RequestRecord
    from cbbench.targets.checks import count_request
    from cbbench.targets.sse import SseStream

    rec = RequestRecord(id=0, prompt_tokens=5, output_tokens=0, intended_start_s=0.0,
                        token_times_s=[0.1, 0.2])
    st = SseStream(chat=False, times=rec.token_times_s)
    st.usage = {"prompt_tokens": bad, "completion_tokens": bad}
    assert count_request(rec, st, None, sample=False) == "events"
    assert rec.output_tokens == 2 and rec.server_prompt_tokens is None
    st.usage = {"prompt_tokens": 5, "completion_tokens": 2}  # a real count is still used
    assert count_request(rec, st, None, sample=False) == "usage" and rec.server_prompt_tokens == 5
