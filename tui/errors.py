"""What every front end raises for a mistake the user can fix: printed as one line, exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; `homegpu` prints it as one `homegpu: error: ...` line, exit status 2."""
