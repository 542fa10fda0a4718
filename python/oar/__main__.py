"""``oar`` and ``python -m oar``: oar's command line, every command of the ``oar`` binary. Its
children (``oar launch``'s servers and trainers) run as ``python -m oar`` too."""

import sys

from ._oar import cli_main


def main():
    cli_main(["oar", *sys.argv[1:]], [sys.executable, "-m", "oar"])


if __name__ == "__main__":
    main()
