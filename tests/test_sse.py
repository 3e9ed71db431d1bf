"""The server-sent events parser, against the WHATWG standard's own examples and its edge cases
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation)."""

from __future__ import annotations

import pytest

from aiqsim.http.sse import SseEvent, SseParser, parse_sse


def test_the_standards_stock_example_joins_data_lines() -> None:
    # "data: YHOO\ndata: +2\ndata: 10\n\n" -> one message event "YHOO\n+2\n10"
    assert parse_sse(b"data: YHOO\ndata: +2\ndata: 10\n\n") == [SseEvent("message", "YHOO\n+2\n10")]


def test_the_standards_comment_and_id_example() -> None:
    stream = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
    assert parse_sse(stream) == [
        SseEvent("message", "first event", "1"),
        SseEvent("message", "second event", ""),  # a bare "id" resets the last event id
        SseEvent("message", " third event", ""),  # only one space after the colon is dropped
    ]


def test_the_standards_empty_data_example() -> None:
    # "data\n\ndata\ndata\n\ndata:" -> "" and "\n"; the last, unterminated event is discarded
    assert parse_sse(b"data\n\ndata\ndata\n\ndata:") == [SseEvent("message", ""), SseEvent("message", "\n")]


def test_the_standards_two_identical_events() -> None:
    assert parse_sse(b"data:test\n\ndata: test\n\n") == [SseEvent("message", "test")] * 2


@pytest.mark.parametrize("end", [b"\r\n", b"\n", b"\r"])
def test_every_line_end_is_one(end: bytes) -> None:
    stream = end.join([b"event: delta", b"data: a", b"data: b", b"", b""])
    assert parse_sse(stream) == [SseEvent("delta", "a\nb")]


def test_bytes_split_anywhere_give_the_same_events() -> None:
    stream = (
        '\ufeffevent: message_start\r\ndata: {"t": "h\u00e9llo \u2603"}\r\n\r\n'
        ": ping\r\nretry: 2500\r\nid: 7\r\ndata: x\r\n\r\n"
    ).encode()
    whole = parse_sse(stream)
    assert whole == [
        SseEvent("message_start", '{"t": "h\u00e9llo \u2603"}'),
        SseEvent("message", "x", "7", 2500),
    ]
    for size in (1, 2, 3, 5):  # CRLF and multi-byte characters split across pieces
        parser = SseParser()
        events = []
        for index in range(0, len(stream), size):
            events.extend(parser.feed(stream[index : index + size]))
        events.extend(parser.close())
        assert events == whole, size


def test_an_event_without_data_is_not_dispatched_and_its_type_is_reset() -> None:
    assert parse_sse(b"event: ping\n\ndata: after\n\n") == [SseEvent("message", "after")]


def test_unknown_fields_bad_retry_and_nul_ids_are_ignored() -> None:
    stream = b"foo: bar\nretry: 10s\nid: a\x00b\ndata: d\n\n"
    parser = SseParser()
    assert parser.feed(stream) == [SseEvent("message", "d", "", None)]
    assert parser.retry is None and parser.last_event_id == ""


def test_invalid_utf8_becomes_the_replacement_character() -> None:
    assert parse_sse(b"data: \xff\n\n") == [SseEvent("message", "\ufffd")]


def test_a_field_without_a_space_keeps_its_value_whole() -> None:
    assert parse_sse(b"data:{}\n\n") == [SseEvent("message", "{}")]


def test_a_last_line_without_its_line_end_sets_nothing() -> None:
    """WHATWG: "once the end of the file is reached, any pending data must be discarded". Before,
    close() processed the unterminated last line, so a cut ``id:`` or ``retry:`` changed the last
    event id and the reconnection time the stream reports."""
    parser = SseParser()
    events = parser.feed(b"id: 1\nretry: 3000\ndata: a\n\nretry: 5000\nid: 7")
    events += parser.close()
    assert [(event.data, event.id, event.retry) for event in events] == [("a", "1", 3000)]
    assert (parser.last_event_id, parser.retry) == ("1", 5000)  # the id line had no line end
