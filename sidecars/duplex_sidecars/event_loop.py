"""The event loop the pod-side programs run on."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` on uvloop when it is installed (a faster event loop and transports), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
