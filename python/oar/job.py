"""Jobs as Python values: a job file's settings as a dict, checked by oar itself."""

from pathlib import Path

from . import _oar


class Job(dict):
    """A job's settings: the sections of a job file (``model``, ``dense_optimizer``,
    ``sparse_optimizer``, ``train``, ``data``) as nested dicts.

    ``Job.load(path)`` reads a job file with every default filled in; ``Job({...})`` or
    ``Job(model=oar.Model(...), train={...})`` takes any part of one (the rest defaults). Settings are checked by oar's own checks, with its error
    messages, whenever the job is written (``toml()``, ``save()``) or ``check()``-ed: an unknown
    key or a bad value raises :class:`oar.ConfigError`.
    """

    def __init__(self, settings=None, /, **sections):
        super().__init__(settings or {})
        for name, section in sections.items():
            # A builder's model goes in as its [model] section.
            self[name] = section.config() if hasattr(section, "config") else section

    @classmethod
    def load(cls, path):
        """The job file at ``path``, read and checked."""
        return cls(_oar.job_from_file(str(path)))

    def toml(self):
        """The job file's text (checked)."""
        return _oar.job_to_toml(self._plain())

    def check(self):
        """Checks the settings; returns the job."""
        self.toml()
        return self

    def normalized(self):
        """The job as ``Job.load`` would read its file: checked, every default filled in."""
        return Job(_oar.job_normalized(self._plain()))

    def _plain(self):
        return {k: (v.config() if hasattr(v, "config") else v) for k, v in self.items()}

    def save(self, path):
        """Writes the job file to ``path`` (checked); returns the path."""
        path = Path(path)
        path.write_text(self.toml())
        return path
