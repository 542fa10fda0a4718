"""A launch's progress as oar reports it (``OAR_LAUNCH_PROGRESS <bytes read> <bytes in all>``
lines of ``oar launch --progress-lines``), drawn where the job was started from: a tqdm bar
(``tqdm.auto``: a widget in a notebook with ipywidgets) if tqdm is installed, else one line
redrawn with a carriage return, which terminals and notebooks both show in place."""

import sys

PREFIX = "OAR_LAUNCH_PROGRESS "


class Progress:
    """Draws progress lines as they come; ``enabled=False`` draws nothing."""

    def __init__(self, enabled=True, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr
        self._bar, self._drawn = None, False

    def line(self, line):
        """Takes one line of the job's output: True if it was a progress line (drawn here)."""
        if not line.startswith(PREFIX):
            return False
        try:
            done, total = (int(v) for v in line[len(PREFIX):].split())
        except ValueError:
            return False
        if self.enabled:
            self._draw(done, total)
        return True

    def _draw(self, done, total):
        if self._bar is None:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, unit="B", unit_scale=True, desc="oar launch", file=self.stream)
            except ImportError:
                self._bar = False
        if self._bar:
            self._bar.update(done - self._bar.n)
            return
        width = 30
        filled = width * done // max(total, 1)
        percent = 100 * done // max(total, 1)
        self.stream.write(f"\roar launch [{'#' * filled}{'.' * (width - filled)}] {percent:3d}% of {total / 1e6:.1f} MB")
        self.stream.flush()
        self._drawn = True

    def close(self):
        """Ends the drawing (the bar stays, finished)."""
        if self._bar:
            self._bar.close()
        elif self._drawn:
            self.stream.write("\n")
            self.stream.flush()
