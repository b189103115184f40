"""Subcommands of the project's console script and ``python -m <pkg>`` (see ``main.SUBCOMMANDS``):
``offsets show | reset | verify`` and ``report``. Each module has ``main(argv) -> int``."""
