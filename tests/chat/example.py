"""The chat example (examples/chat), loaded as ``tinystore demo`` loads it."""

from __future__ import annotations

import importlib
from typing import Any

from tinystore.cli.demo import PACKAGE, load_example

app: Any = load_example()
service: Any = importlib.import_module(f"{PACKAGE}.service")
model: Any = importlib.import_module(f"{PACKAGE}.model")


def fast_model() -> Any:
    """The offline model, quick: 2 ms a token, 20 ms before the first."""
    return model.OfflineModel(delay=0.002, first_delay=0.02)
