"""The result file: versioned JSON, written atomically so a reader never sees half a file."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path

from cbbench import __version__
from cbbench.errors import UsageError
from cbbench.load.interrupts import STOP_SIGNALS
from cbbench.schema import read_json_file  # noqa: F401 (the readers of other formats use it)
from cbbench.schema.base import Record, dumps, file_text  # noqa: F401 (dumps: for writers)
from cbbench.schema.run import RUN_SCHEMA_VERSION

SCHEMA_VERSION = RUN_SCHEMA_VERSION  # the one definition is the schema's


STDOUT = "-"  # --output -: write to standard output


def is_stdout(path) -> bool:
    return str(path) == STDOUT


def write_atomic(path, data: str | bytes) -> None:
    """Write a whole file so that no reader ever sees half of it, and touch nothing else:

    - ``-``: standard output;
    - a device, FIFO or socket (symlinks resolved): written into, never replaced (a rename
      over /dev/null would break it for the whole machine);
    - a regular file, or a new one: a temporary file beside the symlink-resolved target,
      fsync'd, then renamed over it (a symlink stays a symlink; an existing file keeps its
      permissions).

    A write that fails (a full disk, a folder that went away) raises UsageError with one line;
    the temporary file is removed and the old file is left whole."""
    raw = _utf8(data)
    if is_stdout(path):
        _write_stdout(raw)
        return
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"output path {path} is a folder; give a file name")
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "wb") as f:
                f.write(raw)
        else:
            _replace(target, raw, st)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def clean_text(value: str) -> str:
    """``value`` as UTF-8 can hold it: a lone surrogate (non-UTF-8 bytes of a file name, a
    result's "\\ud800") as U+FFFD, where encode() raised a traceback."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _utf8(data: str | bytes) -> bytes:
    """A text's UTF-8 bytes (see clean_text); bytes as they are."""
    return clean_text(data).encode() if isinstance(data, str) else data


def _write_stdout(raw: bytes) -> None:
    out = sys.stdout
    out.flush()
    try:
        out.buffer.write(raw)
    except AttributeError:  # a text-only stream (tests capture stdout this way)
        out.write(raw.decode())
    out.flush()


def _replace(target: Path, raw: bytes, old: os.stat_result | None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp, _mode(old))
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _mode(old: os.stat_result | None) -> int:
    """An existing file keeps its mode; a new one gets what a plain open() would give (mkstemp
    creates 0600)."""
    if old is not None:
        return stat.S_IMODE(old.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends, then reach the handlers they
    would have: a second Ctrl-C between two renames of a group left a result without its
    export (or beside a previous run's). Noted by a handler, not a signal mask: a mask is
    per thread, and a process signal goes to any thread that does not block it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and only it runs them)
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None: set outside Python, which cannot be restored: the default action, rather
            # than leave this block's recorder to swallow every later signal.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in caught:
            signal.raise_signal(sig)


def write_atomic_group(files: dict) -> None:
    """Write several files that belong together (a main file and its sidecar) all or none:
    each is staged in full (written and synced) before any replaces its target, so a write
    that fails (a full disk) leaves every target as it was. Written one by one, a full disk
    left a Parquet export without its sidecar. Devices and stdout are written in order."""
    if any(is_stdout(p) or (os.path.exists(p) and not os.path.isfile(p)) for p in files):
        for path, raw in files.items():
            write_atomic(path, raw)
        return
    staged: list[tuple[str, Path]] = []
    try:
        for path, raw in files.items():
            target = Path(os.path.realpath(path))
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                       dir=target.parent)
            staged.append((tmp, target))
            os.chmod(tmp, _mode(os.stat(target) if target.is_file() else None))
            with os.fdopen(fd, "wb") as f:
                f.write(_utf8(raw))
                f.flush()
                os.fsync(f.fileno())
    except BaseException as e:  # a Ctrl-C too: it left the staged temporary files behind
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise UsageError(f"cannot write {target}: {e.strerror or e}; none of "
                             f"{', '.join(str(p) for p in files)} was written") from None
        raise
    with _signals_held():  # every file replaced, or (a signal before this) none
        for tmp, target in staged:
            os.replace(tmp, target)


def write_result(path, result: Record | dict) -> None:
    """A result file, atomically: a model by its own dump (a dict as it is, transitional)."""
    write_atomic(path, file_text(result))


def check_writable(path) -> None:
    """Fail before the run, not after an hour of measuring."""
    if is_stdout(path):
        return
    target = Path(os.path.realpath(path))
    try:
        os.stat(target)
    except FileNotFoundError:
        pass
    except OSError as e:  # a symlink loop, a path through a file: refused before the run
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    if target.is_dir():
        raise UsageError(f"output path {path} is a folder; give a file name")
    if target.exists() and not target.is_file():  # a device or FIFO: written into
        if not os.access(target, os.W_OK):
            raise UsageError(f"cannot write to {path}: permission denied")
        return
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create output folder {Path(path).parent}: {e.strerror}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".cbbench-probe.", dir=parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"cannot write to {Path(path).parent}: {e.strerror}") from None


def check_distinct_outputs(outputs) -> None:
    """Refuse two outputs of one command that are one file ((flag, path) pairs; None and
    stdout skipped): the later write replaced the earlier one without a word (`compare
    --markdown X --csv X`; a --csv onto a variant's own result in --out-dir)."""
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path is None or is_stdout(path):
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{flag} {path} is also where {seen[real]} writes: give each "
                             "output a path of its own")
        seen[real] = flag


def check_not_an_input(output, inputs, flag: str) -> None:
    """Refuse an output that is also one of the command's inputs, by any name: the same
    resolved path (a symlink, `..`) or the same file (a hard link: device and inode). Writing
    it would replace that input (`calibrate R.json --out R.json`, `run --replay R.json
    --output R.json`: a real run replaced by its own simulation). Every command calls this
    one guard for every file it writes, with every file it reads (workload, results,
    profiles, tokenizer, trace, replay)."""
    if output is None or is_stdout(output):
        return
    out = Path(output)
    real_out = os.path.realpath(out)
    if os.path.exists(out) and not os.path.isfile(out):
        return  # a device or FIFO is written into, not replaced
    for inp in inputs:
        if inp is None or is_stdout(inp) or not os.path.exists(inp):
            continue  # a built-in name, not a file
        same = os.path.realpath(inp) == real_out
        if not same and os.path.exists(out):
            try:
                same = os.path.samefile(out, inp)
            except OSError:
                same = False
        if same:
            raise UsageError(
                f"{flag} {output} is also an input of this command ({inp}): writing it would "
                "replace that input; give another path"
            )


def check_folder_not_inputs(folder, names, inputs, flag: str) -> None:
    """The guard for a command that writes several files into a folder (`report --out DIR`,
    `sweep --out-dir DIR`): ``names`` are the file names it writes there (shell patterns for
    those named by what is measured, `rate-*.json`); an input inside the folder with one of
    those names is refused, as a file output over an input is."""
    import fnmatch

    folder = Path(folder)
    for name in names:
        if any(c in name for c in "*?["):
            for inp in inputs:
                if inp is None or is_stdout(inp) or not os.path.exists(inp):
                    continue
                here = Path(os.path.realpath(inp))
                if (here.parent == Path(os.path.realpath(folder))
                        and fnmatch.fnmatch(here.name, name)):
                    check_not_an_input(folder / here.name, [inp], flag)
        else:
            check_not_an_input(folder / name, inputs, flag)


def engine_inputs(engine_opts) -> list:
    """The files an engine's options read (the device profile): inputs of every command
    that builds an engine."""
    return [getattr(engine_opts, "gpu_profile", None)]


def base_result(config: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "cbbench_version": __version__,
        "interrupted": False,
        "config": config,
    }
