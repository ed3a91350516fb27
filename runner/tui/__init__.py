"""The flowrun operator console (Textual): ``FlowrunApp`` and its views.

Reads go through :mod:`runner.tui.data`; commands only through
``runner.ops.commands.submit``. Never imports the worker or the executor.
"""
