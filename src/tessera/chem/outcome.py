"""Results on disk that survive a crash: atomic writes, the phases a run finished, exit codes.

- :func:`atomic_file` / :func:`write_json`: a file is replaced by writing a temporary
  file in the same folder, flushing it to disk (fsync) and renaming it over the old one
  (``os.replace``), so the file holds either its old or its new content, never a part of
  one (a full disk or a kill in the middle leaves the previous file as it was; the
  checkpoint's CCSD iterations between phase ends skip the flush). Every
  such write holds :data:`WRITE_LOCK`; the interrupt path takes it before it ends the
  process, so it never ends one half-way through a rename.
- :func:`check_output_path`: an output file name checked when the run starts (empty name,
  missing folder, a folder that cannot be written, a directory, the input file itself),
  not after hours of work.
- :class:`ResultFile`: the JSON result of ``tessera run``, rewritten after each phase
  (``"completed"`` lists the phases that finished), and on an error or interrupt with
  ``"error"`` added; the traceback of an internal error goes to a file next to it.
- Exit codes of ``tessera run``: 0 ok, 1 not converged, 2 bad input (or an output file
  that cannot be written), 3 internal error, 128 + signal number when interrupted
  (130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import traceback
from contextlib import contextmanager, suppress
from pathlib import Path

from tessera.errors import InputError, OutputError

EXIT_OK = 0
EXIT_NOT_CONVERGED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_SIGNAL_BASE = 128

#: Held while a file is replaced (re-entrant: a writer may call another).
WRITE_LOCK = threading.RLock()


@contextmanager
def atomic_file(path, durable: bool = True):
    """Yield a temporary path next to ``path``; when the block ends without an error the
    temporary file is fsync'ed and renamed over ``path``. On an error it is removed and
    ``path`` is untouched. The caller writes the temporary file and closes it.
    ``durable=False``: renamed without the fsyncs (still atomic for any process that
    reads it, and the write survives the end or a kill of this process; only a crash of
    the operating system before the kernel writes it back may lose it)."""
    path = Path(path)
    folder = path.parent
    with WRITE_LOCK:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            os.chmod(tmp, _mode_of(path))
            yield tmp
            if durable:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        if not durable:
            return
        with suppress(OSError):       # make the rename itself durable
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _mode_of(path: Path) -> int:
    """The permissions the new file gets: the old file's, else what open() would give."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path, text: str, what: str = "--json") -> None:
    """Replace ``path`` by ``text`` atomically; OutputError (one line) if that fails."""
    try:
        with atomic_file(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
    except OSError as err:
        raise OutputError(f"cannot write {what} {path}: {err.strerror or err}; the previous "
                          "file, if any, is unchanged: free space or choose another path") from None


def to_json(data) -> str:
    return json.dumps(data, indent=1, default=float)


def write_json(path, data, what: str = "--json") -> None:
    write_text(path, to_json(data), what)


def check_output_path(path, option: str = "--json", inputs=()) -> Path:
    """``path`` as an output file that can be written, checked before any work: a
    non-empty name, an existing folder where files can be created, not a directory, not
    one of ``inputs`` (the files the run reads). InputError naming ``option`` otherwise."""
    if path is None or not str(path).strip():
        raise InputError(f"{option} needs a file name, got an empty string: give a path such as result.json")
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {path} is a directory; expected a file name inside it")
    folder = p.parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: folder {str(folder)!r} does not exist; create it first "
                         "or choose another path")
    for other in inputs:           # file names only (not XYZ text, not a PySCF Mole)
        if not isinstance(other, (str, os.PathLike)) or "\n" in str(other):
            continue
        same = False
        with suppress(OSError, ValueError):
            same = p.exists() and Path(other).exists() and os.path.samefile(p, other)
        if same:
            raise InputError(f"{option} {path} is the input file {other}; writing it would destroy "
                             "the input: choose another name")
    try:                            # the real test: can a file be created there?
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise InputError(f"{option} {path}: cannot create files in {str(folder)!r} "
                         f"({err.strerror or err}); choose a writable folder") from None
    return p


class ResultFile:
    """The JSON result of one run (``path`` None: nothing is written), rewritten after
    each phase; keeps the text last written so that an error or an interrupt (possibly
    from another thread) can add what went wrong without touching the live data."""

    def __init__(self, path=None):
        self.path = None if path is None else Path(path)
        self.written: str | None = None     # JSON text on disk

    def save(self, data: dict) -> None:
        if self.path is None:
            return
        text = to_json(data)
        write_text(self.path, text)
        self.written = text

    def add_error(self, error: dict) -> bool:
        """Rewrite the last saved result with ``"error": error`` (True if done). Never
        raises: it runs while the run is already failing."""
        if self.path is None or self.written is None:
            return False
        try:
            with WRITE_LOCK:
                data = json.loads(self.written)
                data["error"] = error
                write_text(self.path, to_json(data))
            return True
        except Exception:       # noqa: BLE001 - the result on disk stays as it was
            return False

    def traceback_path(self, rank: int = 0) -> Path:
        """Where an internal error's traceback goes: next to the JSON (``out.json`` ->
        ``out.traceback.txt``; rank r > 0: ``out.rank<r>.traceback.txt``), else
        ``tessera.traceback.txt`` in the current folder."""
        stem = self.path.with_suffix("") if self.path is not None else Path("tessera")
        return stem.with_name(stem.name + (f".rank{rank}" if rank else "") + ".traceback.txt")

    def save_traceback(self, exc: BaseException, header: str, rank: int = 0) -> str:
        """Write ``exc``'s traceback; returns the file's path, or why it could not be written."""
        path = self.traceback_path(rank)
        text = header + "\n\n" + "".join(traceback.format_exception(exc))
        try:
            with atomic_file(path) as tmp:
                Path(tmp).write_text(text, encoding="utf-8")
        except OSError as err:
            return f"not saved: {err.strerror or err}"
        return str(path)
