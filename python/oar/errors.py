"""oar's exceptions. Each carries oar's own one-line message (the command line's, without its
``oar: error:`` prefix)."""


class OarError(Exception):
    """Anything oar refused or could not do."""


class ConfigError(OarError, ValueError):
    """A job's settings that oar refuses: an unknown key, a bad value, a graph that does not
    check. The message names the setting or layer."""


class JobFailed(OarError):
    """A job run as child processes (launch, train, export, ...) that ended in failure.

    ``exit_code`` is the command's exit status (1: an error oar reported, 2: a usage error,
    3: a lost peer); ``args`` the command line it ran.
    """

    def __init__(self, message, exit_code=None, command=None):
        super().__init__(message)
        self.exit_code = exit_code
        self.command = command
