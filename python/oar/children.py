"""Children of ``python -m oar`` that listen: a server, a model being served."""

import queue
import subprocess
import sys
import threading
import time

from .errors import JobFailed


class Listening:
    """A child ``python -m oar ...`` that prints ``PREFIX address`` once it listens; its error
    output is passed to ``sys.stderr`` and kept (``errors``). Waits up to ``wait`` seconds."""

    def __init__(self, args, prefix, wait, what):
        self.command = [sys.executable, "-m", "oar", *[str(a) for a in args]]
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self.errors, self.address = [], None
        lines = queue.Queue()

        def read():
            # Read to the end, so a child that prints more never blocks on a full pipe.
            for line in self.process.stdout:
                lines.put(line)
            lines.put(None)

        def read_errors():
            for line in self.process.stderr:
                self.errors.append(line)
                sys.stderr.write(line)

        threading.Thread(target=read, daemon=True).start()
        self._reading_errors = threading.Thread(target=read_errors, daemon=True)
        self._reading_errors.start()
        deadline = time.monotonic() + wait
        try:
            while self.address is None:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                if line is None:
                    code = self.process.wait()
                    self._reading_errors.join()
                    said = said_in(self.errors, f"{what} ended (exit status {code}) before it listened")
                    raise JobFailed(said, code, self.command)
                if line.startswith(prefix + " "):
                    self.address = line.split()[1]
        except queue.Empty:
            self.stop()
            raise JobFailed(f"{what} did not listen within {wait} s", None, self.command) from None
        except KeyboardInterrupt:
            self.stop()
            raise

    def wait(self, timeout):
        """Waits up to ``timeout`` seconds for the child to end; returns its exit status (None
        if it has not ended)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reading_errors.join()
        return code

    def stop(self):
        """Stops the child: SIGTERM, then a kill after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def said_in(errors, otherwise):
    """oar's message among a process's error lines: its last ``oar: error:`` line (or, for a
    flag it did not take, the command line's ``error:`` line), else the last line, else
    ``otherwise``."""
    for prefix in ("oar: error: ", "error: "):
        said = [line[len(prefix):].strip() for line in errors if line.startswith(prefix)]
        if said:
            return said[-1]
    return errors[-1].strip() if errors else otherwise
