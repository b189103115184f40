"""Subcommands of the project's command (``<command> <subcommand> ...``); each module has
``main(argv) -> int``, dispatched from ``main.py``'s ``SUBCOMMANDS``."""
