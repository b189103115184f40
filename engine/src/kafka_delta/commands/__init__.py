"""The subcommands of a project's console script (``kafka_delta.cli``): ``offsets show | reset |
verify`` (:mod:`.offsets`, :mod:`.reset`, :mod:`.verify`), ``table maintain`` (:mod:`.table`)
and ``report`` (:mod:`.report`); :mod:`.arguments` holds the options every command shares and
builds the config they choose. Each command module has ``main(argv, prog) -> int``."""
