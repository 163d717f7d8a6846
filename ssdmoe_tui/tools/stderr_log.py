"""An MCP server's stderr, kept in a log of bounded size.

A stdio server's stderr must not reach the terminal the app draws on, so it goes to
`mcp-NAME.log` in the data folder. Given the file itself, a server that floods stderr
filled the disk (2.1 GiB in 4 s in one run, appended across runs). The server now writes
into a pipe, and a thread copies it into the log: once the log holds `LOG_MAX` bytes it
becomes `mcp-NAME.log.1` (replacing the one before) and a new log starts, so a server's
output never takes more than twice `LOG_MAX` on disk, and its last words are kept. The
logs are private (0600): a server's stderr can echo the arguments, which come from the
user's prompts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TextIO

LOG_MAX = 4 << 20  # bytes in one log file; one older file is kept beside it
_CHUNK = 1 << 16


class StderrLog:
    """What a stdio server's stderr is (`writer`, handed to the spawn) and the thread
    that copies it into `path`, capped and rotated. `path` None: the output is dropped."""

    def __init__(self, path: Path | None, limit: int = LOG_MAX) -> None:
        self.path, self.limit = path, limit
        self._thread: threading.Thread | None = None
        if path is None:
            self.writer: TextIO = open(os.devnull, "w")  # noqa: SIM115 - closed by close()
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._log = self._open()
        self._size = os.fstat(self._log).st_size
        if self._size >= limit:  # a full log from an earlier run
            self._rotate()
        read, write = os.pipe()
        self.writer = os.fdopen(write, "w")
        self._thread = threading.Thread(
            target=self._pump, args=(read,), name=f"ssdmoe-mcp-log-{path.stem}", daemon=True
        )
        self._thread.start()

    @property
    def rotated(self) -> Path | None:
        return None if self.path is None else self.path.with_name(self.path.name + ".1")

    def _open(self) -> int:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # an older log made before this rule
        return fd

    def _rotate(self) -> None:
        assert self.path is not None and self.rotated is not None
        os.close(self._log)
        os.replace(self.path, self.rotated)
        self._log = self._open()
        note = f"[ssdmoe: earlier output in {self.rotated.name}; this log is capped]\n"
        os.write(self._log, note.encode())
        self._size = os.fstat(self._log).st_size  # another app's server may share it

    def _pump(self, read: int) -> None:
        """Copy the pipe into the log until every writer has closed it (the server and
        any child it left running); the log's size stays within `limit`. The pipe is
        read to its end even when the log cannot be written (a full disk): a server
        whose stderr is closed on it may fail."""
        writable = True
        try:
            while data := os.read(read, _CHUNK):
                if writable:
                    try:
                        self._write(data)
                    except OSError:
                        writable = False  # the rest of the output is dropped
        finally:
            os.close(read)
            os.close(self._log)

    def _write(self, data: bytes) -> None:
        while data:
            room = self.limit - self._size
            if room <= 0:
                self._rotate()
                continue
            written = os.write(self._log, data[:room])
            self._size += written
            data = data[written:]

    def spawned(self) -> None:
        """The server has started with the pipe as its stderr: this side's copy of the
        write end is closed, so the pipe ends when the server's ends."""
        if not self.writer.closed:
            self.writer.close()

    def close(self, wait: float = 0.0) -> None:
        """No more servers on this log; `wait` seconds at most for its copy to finish
        (it finishes once the server has exited)."""
        self.spawned()
        if self._thread is not None and wait > 0:
            self._thread.join(wait)
