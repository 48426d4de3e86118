"""The model the chat asks: an interface, an offline default, and an adapter for OpenAI-compatible endpoints.

- :class:`OfflineModel` needs nothing: a small text generator that streams its answer word by word with a
  realistic delay per token (30 ms by default: about 33 tokens a second, and 250 ms before the first).
- :class:`OpenAICompatibleModel` streams chat completions from any endpoint that speaks OpenAI's
  ``/chat/completions`` (OpenAI, Ollama, vLLM, llama.cpp's server, LM Studio...), with httpx.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import random
import re
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import tinystore


@dataclasses.dataclass
class Turn:
    """One message of a conversation: ``role`` is ``"user"``, ``"assistant"`` or ``"system"``."""

    role: str
    text: str


class Model(Protocol):
    """What the chat needs of a model."""

    def stream(self, history: Sequence[Turn]) -> AsyncIterator[str]:
        """The answer to the last turn of ``history``, as text pieces (tokens) as they come."""
        ...

    async def summarize(self, history: Sequence[Turn]) -> str:
        """A short summary of ``history``."""
        ...


class ModelError(Exception):
    """The model could not answer now (a rate limit, a timeout, a server error): the job retries later."""


# ------------------------------------------------------------------------------------------ offline

_OPENINGS = [
    "Good question about {topic}.",
    "Here is how I would think about {topic}.",
    "Let me take {topic} step by step.",
    "Short answer on {topic}: it depends, but mostly yes.",
]
_SENTENCES = [
    "Every open tab hears the reply at once, because each one listens to the chat's branch of a channel.",
    "The reply is saved and announced in one transaction, so no tab hears of a message it cannot read.",
    "A tab that falls behind gets one reload instead of slowing everybody else down.",
    "The database is the log; an event only says where to look again.",
    "Work that takes seconds streams, and work that outlives the tab becomes a job.",
    "A job is retried with backoff and jitter, so a flaky model costs a delay, not an answer.",
    "Only one worker writes a chat's summary at a time, and the fence makes a late one harmless.",
    "Keep the request short and let the worker do the slow part.",
    "If it must survive a restart, it belongs in a table or a queue, not in memory.",
    "Small, boring pieces that each do one thing are easier to trust.",
]
_CLOSINGS = ["Does that help?", "Want me to go deeper on any part?", "Happy to expand on that.", ""]
_WORD = re.compile(r"[A-Za-zÀ-ÿ0-9']{4,}")
_STOP = {"what", "that", "this", "with", "from", "have", "about", "there", "would", "could", "should", "your"}


class OfflineModel:
    """A small text generator that needs no network: it answers from a few canned sentences, picked by the
    question (the same question gets the same answer), mentioning a word of it, streamed word by word.

    ``delay``: seconds between tokens (each varies by ±50%); ``first_delay``: seconds before the first
    (the model "thinking"); ``sentences``: how many sentences an answer has (besides the opening).
    """

    def __init__(self, delay: float = 0.03, first_delay: float = 0.25, sentences: int = 2) -> None:
        self.delay = delay
        self.first_delay = first_delay
        self.sentences = sentences

    def answer(self, question: str) -> str:
        seed = int.from_bytes(hashlib.sha256(question.encode("utf-8", "replace")).digest()[:8], "big")
        rng = random.Random(seed)
        words = [w for w in _WORD.findall(question) if w.lower() not in _STOP]
        topic = f'"{rng.choice(words)}"' if words else "that"
        parts = [rng.choice(_OPENINGS).format(topic=topic), *rng.sample(_SENTENCES, self.sentences)]
        closing = rng.choice(_CLOSINGS)
        if closing:
            parts.append(closing)
        return " ".join(parts)

    async def stream(self, history: Sequence[Turn]) -> AsyncIterator[str]:
        question = next((t.text for t in reversed(history) if t.role == "user"), "")
        await asyncio.sleep(self.first_delay)
        words = self.answer(question).split(" ")
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(self.delay * random.uniform(0.5, 1.5))
            yield word if i == len(words) - 1 else word + " "

    async def summarize(self, history: Sequence[Turn]) -> str:
        await asyncio.sleep(self.first_delay)
        turns = [t for t in history if t.role != "system"]  # (the summary before this one is not a message)
        users = [t.text for t in turns if t.role == "user"]
        counts: dict[str, int] = {}
        for text in users:
            for w in _WORD.findall(text.lower()):
                if w not in _STOP:
                    counts[w] = counts.get(w, 0) + 1
        top = sorted(counts, key=lambda w: (-counts[w], w))[:5]
        about = ", ".join(top) if top else "nothing in particular"
        return f"the last {len(turns)} messages ({len(users)} from the user) are mostly about: {about}."


# ------------------------------------------------------------------------------------------ OpenAI-compatible


class OpenAICompatibleModel:
    """Chat completions from an OpenAI-compatible endpoint, streamed (``"stream": true``, server-sent events).

    ``url``: the API's base (``https://api.openai.com/v1``, ``http://localhost:11434/v1``) or the full
    ``.../chat/completions`` URL. ``model``: the model's name. ``api_key``: sent as a bearer token (default:
    ``$OPENAI_API_KEY``, none when unset). A 408, 409, 429 or 5xx answer, a timeout or a dropped connection
    raises :class:`ModelError` (the job retries); any other 4xx raises ``tinystore.PermanentError`` (the job
    ends ``dead`` with the reason: a wrong key or model name does not fix itself).
    """

    def __init__(self, url: str, model: str = "gpt-4o-mini", api_key: str | None = None, timeout: float = 60.0):
        url = url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "text/event-stream"}
        if self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
        return h

    def _body(self, history: Sequence[Turn], stream: bool) -> dict[str, object]:
        return {
            "model": self.model,
            "stream": stream,
            "messages": [{"role": t.role, "content": t.text} for t in history],
        }

    @staticmethod
    async def _check(response: object) -> None:
        import httpx

        assert isinstance(response, httpx.Response)
        if response.status_code < 400:
            return
        text = (await response.aread()).decode("utf-8", "replace")[:300]
        reason = f"the model endpoint answered {response.status_code}: {text}"
        if response.status_code in (408, 409, 429) or response.status_code >= 500:
            raise ModelError(reason)
        raise tinystore.PermanentError(reason)

    async def stream(self, history: Sequence[Turn]) -> AsyncIterator[str]:
        import httpx

        try:
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=10.0)) as client,
                client.stream("POST", self.url, json=self._body(history, True), headers=self._headers()) as r,
            ):
                await self._check(r)
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    try:
                        chunk = json.loads(payload)
                        choices = chunk.get("choices") or [{}]
                        piece = (choices[0].get("delta") or {}).get("content")
                    except (ValueError, AttributeError, IndexError, TypeError):
                        raise ModelError(
                            f"the model endpoint sent a chunk that is not a completion: {payload[:200]}"
                        ) from None
                    if piece:
                        yield piece
        except httpx.TransportError as exc:
            raise ModelError(f"the model endpoint {self.url} could not be reached: {exc!r}") from exc

    async def summarize(self, history: Sequence[Turn]) -> str:
        import httpx

        prompt = [
            Turn("system", "Summarize this conversation in two or three sentences."),
            *history,
        ]
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=10.0)) as client:
                r = await client.post(self.url, json=self._body(prompt, False), headers=self._headers())
                await self._check(r)
                body = r.json()
        except httpx.TransportError as exc:
            raise ModelError(f"the model endpoint {self.url} could not be reached: {exc!r}") from exc
        try:
            return str(body["choices"][0]["message"]["content"]).strip()
        except (KeyError, IndexError, TypeError):
            raise ModelError(f"the model endpoint sent no summary: {str(body)[:200]}") from None
