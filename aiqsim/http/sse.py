"""A pure, incremental parser of server-sent events (``text/event-stream``).

It follows the WHATWG HTML standard's "event stream interpretation"
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- the stream is UTF-8 (invalid bytes become U+FFFD; one leading byte order mark is dropped);
- lines end with CRLF, LF or CR (a CR at the end of one piece and an LF at the start of the next
  are one line end);
- a line starting with ``:`` is a comment (servers send them as keep-alives);
- ``field: value`` (one space after the colon dropped), or a bare ``field`` with an empty value;
  ``event`` sets the type, ``data`` appends a line to the data, ``id`` sets the last event id
  (unless it holds U+0000), ``retry`` sets the reconnection time (ASCII digits only); other
  fields are ignored;
- an empty line dispatches the event: none when no ``data`` line came (the type is reset); the
  data's last line feed is removed; the type defaults to ``message``;
- an event not closed by an empty line when the stream ends is discarded.

No I/O and no clock: :meth:`SseParser.feed` takes bytes as they arrive and returns the events they
complete, so the same parser serves any transport and is tested on bytes alone.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SseEvent", "SseParser", "parse_sse"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its type (``message`` by default), its data (lines joined by ``\\n``),
    the last event id when it was dispatched (``""`` when none was set), and the ``retry`` (ms)
    the stream had set by then, if any."""

    event: str
    data: str
    id: str = ""
    retry: int | None = None


class SseParser:
    """Feed it the stream's bytes as they come; it returns each event as soon as it is complete."""

    __slots__ = ("_data", "_decoder", "_event", "_line", "_saw_cr", "_started", "last_event_id", "retry")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line: list[str] = []
        self._saw_cr = False
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self.last_event_id = ""
        """The last ``id`` field seen (kept across events, as the standard's "last event ID")."""
        self.retry: int | None = None
        """The last valid ``retry`` field, in milliseconds."""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events completed by ``chunk`` (bytes as received, split anywhere)."""
        return self._text(self._decoder.decode(chunk))

    def close(self) -> list[SseEvent]:
        """End of stream: flush the decoder. What is still pending is discarded, as the standard
        says ("once the end of the file is reached, any pending data must be discarded"): an event
        with no closing empty line, and a last line with no line end (not a line of the stream's
        grammar: an unterminated ``id:`` or ``retry:`` sets nothing)."""
        events = self._text(self._decoder.decode(b"", final=True))
        self._line = []
        self._event = ""
        self._data = []
        return events

    @property
    def pending(self) -> bool:
        """Whether an event has begun (a data line, a type) and not been dispatched yet."""
        return bool(self._data or self._event or self._line)

    def _text(self, text: str) -> list[SseEvent]:
        events: list[SseEvent] = []
        if not text:
            return events
        if not self._started:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        position = 0
        if self._saw_cr and text.startswith("\n"):  # the LF of a CRLF split across two pieces
            position = 1
        self._saw_cr = False
        length = len(text)
        while position < length:
            cr = text.find("\r", position)
            lf = text.find("\n", position)
            if cr < 0 and lf < 0:
                self._line.append(text[position:])
                break
            end = lf if cr < 0 or (0 <= lf < cr) else cr
            self._line.append(text[position:end])
            line = "".join(self._line)
            self._line = []
            self._process_line(line, events)
            if text[end] == "\r":
                if end + 1 < length:
                    position = end + 2 if text[end + 1] == "\n" else end + 1
                else:
                    self._saw_cr = True
                    position = end + 1
            else:
                position = end + 1
        return events

    def _process_line(self, line: str, events: list[SseEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line[0] == ":":
            return  # a comment
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\x00" not in value:
                self.last_event_id = value
        elif name == "retry" and value and value.isascii() and value.isdigit():
            self.retry = int(value)
        # any other field is ignored

    def _dispatch(self, events: list[SseEvent]) -> None:
        event, data = self._event, self._data
        self._event = ""
        self._data = []
        if not data:
            return
        events.append(SseEvent(event or "message", "\n".join(data), self.last_event_id, self.retry))


def parse_sse(payload: bytes) -> list[SseEvent]:
    """Every event of a whole stream (a convenience for tests and recorded streams)."""
    parser = SseParser()
    return [*parser.feed(payload), *parser.close()]
