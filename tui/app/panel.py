"""Panel: a widget drawn from a function of its own width, at paint time.

The job's loss plot and the node's sparklines are as wide as their panel. Drawing them when the
panel paints, rather than when data arrives, means they always fit the width the panel has now,
even before the first layout or right after a resize.
"""

from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual.widget import Widget

Draw = Callable[[int], Text]


class Panel(Widget):
    DEFAULT_CSS = "Panel { height: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._draw: Draw = lambda width: Text("")

    def show(self, draw: Draw) -> None:
        """Draw with `draw(width)` from now on (and now)."""
        self._draw = draw
        self.refresh(layout=True)

    def render(self) -> Text:
        return self._draw(self.content_size.width)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._draw(width).wrap(self.app.console, width or 1))
