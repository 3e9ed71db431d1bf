"""What a run leaves for the cycle collector: the failures a traceback cycle kept alive.

A failed call's error, held by a frame in its own traceback (or by an object that frame holds),
lives on until the collector runs; a simulation sweep or a busy worker pays for that in GC time
(tests/test_gc_tuning.py). :func:`cyclic_garbage` runs a block with the collector off and says
which objects of the given types only a collection would have freed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def cyclic_garbage(run: Callable[[], T], kinds: type | tuple[type, ...]) -> tuple[T, list[str]]:
    """``run()``'s value, and the type names of the ``kinds`` instances it left in reference cycles
    (``[]`` when reference counting freed them all). ``run`` should drop what it returns of them."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        value: Any = run()
        gc.collect()
        kept = [type(obj).__name__ for obj in gc.garbage if isinstance(obj, kinds)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    return value, kept
