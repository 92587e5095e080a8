"""`python -m zrepl_py` runs the zbak command line."""

from zrepl_py.cli import entry_point

entry_point()
