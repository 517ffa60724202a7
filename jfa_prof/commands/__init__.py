"""One module per ``jfa-prof`` command: parse, check inputs, call the library, hand the
result to a renderer. Module level imports stay light (typer, standard library) because
``jfa_prof.cli`` imports every command module to build ``--help``.
"""
