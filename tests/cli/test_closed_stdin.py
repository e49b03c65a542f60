"""`cbbench serve <&-` (a service manager, `nohup ... <&-`): with fd 0 closed the server's first
socket took fd 0, and uvloop aborted on closing it at shutdown (libuv asserts fd > 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from helpers import CBBENCH

INTERRUPTED_EXIT = 130


def test_serve_with_stdin_closed_stops_cleanly_on_sigint(tmp_path):
    """Before: SIGINT ended it with `uv__close: Assertion 'fd > STDERR_FILENO' failed`, exit
    134 (SIGABRT)."""
    proc = subprocess.Popen([*CBBENCH, "serve", "--engine", "sim", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, preexec_fn=lambda: os.close(0))
    try:
        assert proc.stdout is not None
        assert "ready at http://" in proc.stdout.readline()
        time.sleep(1)  # serving: a SIGINT now is the ordinary shutdown
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode in (0, INTERRUPTED_EXIT), (proc.returncode, err)  # not SIGABRT
    assert "Assertion" not in err and "Traceback" not in err, err
