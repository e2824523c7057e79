"""The incremental SSE decoder and the Responses tap."""

from __future__ import annotations

import gzip
import random
import zlib

import orjson
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from proxy.items.sse import ResponseTap, SSEDecoder, StreamTap, encode_event

STREAM = (
    b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
    b"\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-5\",\"status\":\"in_progress\"}}\n\n"
    b": a comment line\n\n"
    b"event: response.output_item.done\r\ndata: {\"type\":\"response.output_item.done\",\r\n"
    b"data: \"sequence_number\":1,\"item\":{\"type\":\"message\",\"id\":\"msg_1\"}}\r\n\r\n"
    b"event: response.completed\rdata: {\"type\":\"response.completed\",\"sequence_number\":2,"
    b"\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[],"
    b"\"usage\":{\"input_tokens\":7,\"output_tokens\":3,\"total_tokens\":10}}}\r\r"
    b"data: [DONE]\n\n"
)


def _decode_all(chunks: list[bytes]) -> list:
    dec = SSEDecoder()
    events = []
    for c in chunks:
        events.extend(dec.feed(c))
    events.extend(dec.close())
    return events


def test_whole_stream_decodes():
    events = _decode_all([STREAM])
    assert [e.event for e in events] == ["response.created", "response.output_item.done", "response.completed", None]
    assert orjson.loads(events[1].data)["item"]["id"] == "msg_1"  # multi-line data joined with \n
    assert events[-1].data == "[DONE]"


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=30))
def test_any_split_gives_the_same_events(cuts):
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert _decode_all(chunks) == _decode_all([STREAM])


def test_byte_by_byte_crlf_split():
    assert _decode_all([bytes([b]) for b in STREAM]) == _decode_all([STREAM])


def test_trailing_event_without_blank_line_is_dispatched_on_close():
    events = _decode_all([b"event: x\ndata: 1"])
    assert len(events) == 1 and events[0].data == "1"


def test_tap_collects_items_usage_and_completion():
    tap = ResponseTap()
    st_ = StreamTap(tap)
    for i in range(0, len(STREAM), 7):
        assert st_(STREAM[i : i + 7]) == STREAM[i : i + 7]  # never changes bytes
    st_(b"")
    assert tap.completed and not tap.incomplete
    assert tap.response_id == "resp_1" and tap.model == "gpt-5"
    assert tap.usage == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    assert [i["id"] for i in tap.items] == ["msg_1"]


def test_tap_marks_incomplete_stream():
    tap = ResponseTap()
    st_ = StreamTap(tap)
    st_(STREAM[:150])
    st_(b"")
    assert tap.incomplete and not tap.completed


def test_tap_reads_compressed_streams():
    for enc, data in (("gzip", gzip.compress(STREAM)), ("deflate", zlib.compress(STREAM)),
                      ("zstd", zstandard.ZstdCompressor().compress(STREAM))):
        tap = ResponseTap()
        st_ = StreamTap(tap, enc)
        rnd = random.Random(1)
        i = 0
        while i < len(data):
            n = rnd.randint(1, 20)
            assert st_(data[i : i + n]) == data[i : i + n]
            i += n
        st_(b"")
        assert tap.usage and tap.usage["total_tokens"] == 10, enc


def test_error_event_forms():
    tap = ResponseTap()
    tap.on_event({"type": "error", "sequence_number": 2, "error": {"code": "context_length_exceeded", "message": "m"}})
    assert tap.error_code == "context_length_exceeded" and tap.completed
    tap = ResponseTap()
    tap.on_event({"type": "error", "code": "server_error", "message": "m", "param": None})
    assert tap.error_code == "server_error"
    tap = ResponseTap()
    tap.on_event({"type": "response.failed", "response": {"id": "r", "status": "failed",
                                                          "error": {"code": "context_length_exceeded"}}})
    assert tap.error_code == "context_length_exceeded"


def test_encode_event_round_trip():
    frame = encode_event({"type": "response.created", "sequence_number": 0})
    [ev] = _decode_all([frame])
    assert ev.event == "response.created" and orjson.loads(ev.data)["sequence_number"] == 0


def test_one_event_per_chunk_decodes_as_the_whole_stream():
    # Each chunk one whole `event:` + `data:` event (the decoder's fast path), against the same bytes in one
    # chunk (line by line); and the shapes the fast path must leave to the general one.
    frames = [encode_event({"type": "response.output_text.delta", "delta": f"d{i}"}) for i in range(5)]
    frames += [b"event: x\ndata: a\ndata: b\n\n", b"event: y\r\ndata: c\r\n\r\n", b"event: z\ndata: e\n\nevent: w\n",
               b"data: f\n\n"]
    assert _decode_all(frames) == _decode_all([b"".join(frames)])
    assert [e.data for e in _decode_all(frames)][-4:] == ["a\nb", "c", "e", "f"]


def test_listeners_hear_parsed_events_not_deltas():
    heard = []
    tap = ResponseTap(listeners=[lambda typ, payload: heard.append(typ)])
    stream = StreamTap(tap)
    stream(encode_event({"type": "response.output_text.delta", "delta": "x"}))
    stream(encode_event({"type": "response.completed", "response": {"id": "r", "usage": {"total_tokens": 3}}}))
    stream(b"")
    assert heard == ["response.completed"] and tap.events == 2 and tap.first_output_seen and tap.completed


def _general_only(tap: ResponseTap) -> StreamTap:
    st = StreamTap(tap)
    st._plain = False  # every chunk through the decoder: what the fast path must agree with
    return st


def _delta(i: int, text: str) -> bytes:
    return encode_event({"type": "response.output_text.delta", "sequence_number": i, "delta": text,
                         "item_id": "msg_1", "output_index": 0, "content_index": 0})


@given(st.lists(st.integers(min_value=1, max_value=4000), max_size=12), st.booleans())
def test_the_one_event_fast_path_observes_what_the_decoder_does(cuts, crlf):
    """A chunk that is one whole counted-only event skips the decoder; the tap must see the same stream either
    way, however the stream is cut into chunks (a cut mid-event leaves the decoder holding bytes: the next
    whole-looking chunk must not be taken on the fast path then)."""
    created = {"id": "resp_f", "model": "gpt-5", "status": "in_progress", "output": []}
    frames = [encode_event({"type": "response.created", "sequence_number": 0, "response": created}),
              b"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{}}\n\n",
              *[_delta(i, f"w{i} ") for i in range(1, 30)],
              b"event: response.output_text.delta\ndata: [DONE]\n\n",  # a sentinel under a delta's name: not counted
              b": a comment\n\n",
              encode_event({"type": "response.output_item.done", "sequence_number": 31,
                            "item": {"type": "message", "id": "msg_1"}}),
              encode_event({"type": "response.completed", "sequence_number": 32,
                            "response": {**created, "status": "completed",
                                         "usage": {"input_tokens": 3, "output_tokens": 30}}})]
    if crlf:
        frames = [f.replace(b"\n", b"\r\n") for f in frames]
    raw = b"".join(frames)
    ends = {sum(len(f) for f in frames[:k + 1]) for k in range(len(frames))}  # each frame a chunk, as upstreams send
    points = sorted(({c % len(raw) for c in cuts} | ends) - {0, len(raw)})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    results = []
    for make in (StreamTap, _general_only):
        tap = ResponseTap()
        stream = make(tap)
        for chunk in pieces:
            assert stream(chunk) == chunk
        stream(b"")
        results.append((tap.events, tap.first_output_seen, tap.completed, tap.incomplete, tap.items, tap.usage,
                        tap.response_id, tap.last_sequence, stream.nbytes))
    assert results[0] == results[1]
    assert results[0][0] == 33 and results[0][2]  # every event but the sentinel and the comment, and the end


def test_a_gzip_stream_never_takes_the_fast_path():
    tap = ResponseTap()
    stream = StreamTap(tap, "gzip")
    assert not stream._plain
    comp = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    body = comp.compress(_delta(1, "x") + _delta(2, "y")) + comp.flush()
    stream(body)
    stream(b"")
    assert tap.events == 2 and tap.first_output_seen
