"""The ``flowrun`` command: the group and its global options (``runner.cli.main``), the
subcommands, and the tables they print."""
