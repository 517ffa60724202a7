"""`python -m jfa_prof` runs the CLI, for machines where the entry point is not installed."""
from jfa_prof.cli import app

app(prog_name="jfa-prof")
