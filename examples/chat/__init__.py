"""The live chat of the seeds, runnable: ``tinystore demo`` (see README.md in this folder).

- :mod:`.service`: the chat's data and jobs on a store (SQL, a channel, two queues, a lock);
- :mod:`.app`: the Starlette app and its JSON and event-stream endpoints;
- :mod:`.model`: the model interface, the offline default, and an OpenAI-compatible adapter;
- ``static/``: the page (HTML, CSS, a little JavaScript with ``EventSource``), ``migrations/``: the schema.
"""

from __future__ import annotations

from .app import create_app
from .model import Model, OfflineModel, OpenAICompatibleModel, Turn
from .service import Chat, ChatEvent

__all__ = ["Chat", "ChatEvent", "Model", "OfflineModel", "OpenAICompatibleModel", "Turn", "create_app"]
