"""Subcommands of the project's console script and ``python -m <pkg>`` (see ``main.SUBCOMMANDS``):
``offsets show | reset | verify``. Each module has ``main(argv) -> int``."""
