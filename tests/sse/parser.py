"""A parser of ``text/event-stream`` written from the WHATWG HTML Living Standard, "Server-sent events",
section 9.2.6 ("Interpreting an event stream") and 9.2.5 (the stream's grammar), to check what we write
the way a browser's ``EventSource`` reads it."""

from __future__ import annotations

import codecs
import dataclasses


@dataclasses.dataclass
class Event:
    """A dispatched event as ``EventSource`` hands it to a listener."""

    type: str
    data: str
    last_event_id: str


class EventStreamParser:
    """Feed bytes in any chunks with :meth:`feed`; it returns the events dispatched so far.

    - UTF-8 decoded with U+FFFD for bad bytes; one leading U+FEFF (BOM) of the stream is dropped;
    - lines end at CR LF, a lone CR or a lone LF (a CR at the end of a chunk waits for the next);
    - a blank line dispatches; ``:`` starts a comment; ``field:value`` with one leading space of the value
      dropped; a line without a colon is a field with an empty value;
    - ``event`` sets the type buffer, ``data`` appends value + LF, ``id`` sets the last event id buffer unless
      the value holds a NUL, ``retry`` sets the reconnection time when all ASCII digits, anything else is
      ignored;
    - dispatch: the last event id becomes the buffer's; an empty data buffer dispatches nothing; one trailing
      LF is removed; the type is ``message`` when the type buffer is empty; the data and type buffers reset.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._first = True
        self.data = ""
        self.event_type = ""
        self.last_event_id_buffer = ""
        self.last_event_id = ""
        self.retry: int | None = None
        self.comments: list[str] = []

    def feed(self, chunk: bytes, final: bool = False) -> list[Event]:
        text = self._decoder.decode(chunk, final)
        if self._first and text:
            self._first = False
            if text.startswith("\ufeff"):
                text = text[1:]
        self._text += text
        out: list[Event] = []
        while True:
            line, rest = self._next_line(final)
            if line is None:
                break
            self._text = rest
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        return out

    def _next_line(self, final: bool) -> tuple[str | None, str]:
        t = self._text
        for i, ch in enumerate(t):
            if ch == "\n":
                return t[:i], t[i + 1 :]
            if ch == "\r":
                if i + 1 < len(t):
                    return t[:i], t[i + 2 :] if t[i + 1] == "\n" else t[i + 1 :]
                if final:
                    return t[:i], ""
                return None, t  # a CR at the end: CR LF may be split across chunks
        return None, t

    def _line(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments.append(line[1:])
            return None
        if ":" in line:
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
        else:
            field, value = line, ""
        if field == "event":
            self.event_type = value
        elif field == "data":
            self.data += value + "\n"
        elif field == "id":
            if "\x00" not in value:
                self.last_event_id_buffer = value
        elif field == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        self.last_event_id = self.last_event_id_buffer
        if self.data == "":
            self.event_type = ""
            return None
        data = self.data[:-1] if self.data.endswith("\n") else self.data
        ev = Event(self.event_type or "message", data, self.last_event_id)
        self.data = ""
        self.event_type = ""
        return ev


def parse(stream: bytes) -> list[Event]:
    """Every event of a whole stream."""
    p = EventStreamParser()
    return p.feed(stream, final=True)
