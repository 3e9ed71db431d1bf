"""A progress display for long runs: a widget in Jupyter, a one-line bar on a terminal.

Small enough that a dependency (tqdm, rich) would cost more than it saves.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def _in_jupyter() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except AttributeError:
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


class Progress:
    """Counts finished units of work out of ``total`` and shows them (silent when not ``enabled``)."""

    def __init__(
        self, total: int, *, label: str = "", enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self.label = label
        self.enabled = enabled and total > 0
        self._stream = stream if stream is not None else sys.stderr
        self._widget: Any = None
        if self.enabled and _in_jupyter():
            import ipywidgets
            from IPython.display import display

            self._bar = ipywidgets.IntProgress(min=0, max=total, description=label[:20])
            self._text = ipywidgets.Label(f"0/{total}")
            self._widget = ipywidgets.HBox([self._bar, self._text])
            display(self._widget)

    def advance(self, *, failed: bool = False) -> None:
        """Record one finished unit (``failed`` ones are counted separately)."""
        self.done += 1
        self.failed += int(failed)
        if not self.enabled:
            return
        suffix = f" ({self.failed} failed)" if self.failed else ""
        if self._widget is not None:
            self._bar.value = self.done
            self._text.value = f"{self.done}/{self.total}{suffix}"
            return
        width = 30
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if self.done >= self.total else ""
        self._stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}{suffix}{end}")
        self._stream.flush()
