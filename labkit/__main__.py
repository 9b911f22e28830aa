"""``python -m labkit``: the same as the ``labkit`` command."""

from .cli import main

main()
