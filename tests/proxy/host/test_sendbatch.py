"""One send per connection and loop turn (proxy/host/sendbatch.py): the first two writes of a turn go at once, the rest
leave together at its end or on drain/close/half-close, in order, and mitmproxy's connection writers batch."""

from __future__ import annotations

import asyncio
import socket

from proxy.host import sendbatch


class FakeTransport(asyncio.Transport):
    """Records each `write` call (what one send would carry)."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closing = False
        self.eof = False

    def write(self, data) -> None:
        assert not self.eof, "write after write_eof"
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0


async def _writer() -> tuple[asyncio.StreamWriter, FakeTransport]:
    loop = asyncio.get_running_loop()
    transport = FakeTransport()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    protocol.connection_made(transport)
    writer = sendbatch.batching(asyncio.StreamWriter(transport, protocol, reader, loop))
    return writer, transport


async def _next_turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_first_two_writes_of_a_turn_go_at_once_the_rest_together_at_its_end():
    writer, transport = await _writer()
    assert isinstance(writer, sendbatch.BatchingWriter)
    writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writer.write(b"5\r\nfirst\r\n")
    assert transport.sends == [b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\nfirst\r\n"]  # head and first chunk: not held
    for k in range(3):
        writer.write(b"1\r\n%d\r\n" % k)
    assert len(transport.sends) == 2  # held until the turn's work is done
    await _next_turn()
    assert transport.sends[2:] == [b"1\r\n0\r\n1\r\n1\r\n1\r\n2\r\n"]  # one send for the rest of the turn
    # A new turn: its first two go at once again.
    writer.write(b"a")
    writer.write(b"b")
    writer.write(b"c")
    assert transport.sends[3:] == [b"a", b"b"]
    await _next_turn()
    assert transport.sends[3:] == [b"a", b"b", b"c"]


async def test_a_write_after_a_held_one_waits_behind_it():
    writer, transport = await _writer()
    writer.write(b"1")
    writer.write(b"2")
    writer.write(b"3")
    writer.flush()  # a drain mid-turn sent what was held; the turn is closed
    writer.write(b"4")
    writer.write(b"5")
    writer.write(b"6")
    await _next_turn()
    assert b"".join(transport.sends) == b"123456"
    assert transport.sends == [b"1", b"2", b"3", b"4", b"5", b"6"]


async def test_drain_close_and_half_close_send_what_the_turn_held_first():
    writer, transport = await _writer()
    for part in (b"a", b"b", b"c", b"d"):
        writer.write(part)
    await writer.drain()
    assert transport.sends == [b"a", b"b", b"cd"]

    for part in (b"e", b"f", b"g"):
        writer.write(part)
    writer.write_eof()
    assert transport.sends[3:] == [b"e", b"f", b"g"] and transport.eof

    writer2, transport2 = await _writer()
    for part in (b"x", b"y", b"z", b"!"):
        writer2.write(part)
    writer2.close()
    assert transport2.sends == [b"x", b"y", b"z!"] and transport2.closing
    await _next_turn()  # the turn's scheduled flush finds nothing left: nothing is sent twice
    assert transport2.sends == [b"x", b"y", b"z!"]


async def test_nothing_is_written_to_a_closing_transport():
    writer, transport = await _writer()
    for part in (b"a", b"b", b"c"):
        writer.write(part)
    transport.closing = True
    await _next_turn()
    assert transport.sends == [b"a", b"b"]


async def test_a_mutable_buffer_is_copied_when_held():
    writer, transport = await _writer()
    writer.write(b"a")
    writer.write(b"b")
    buf = bytearray(b"cd")
    writer.write(buf)
    buf[:] = b"XX"
    await _next_turn()
    assert transport.sends == [b"a", b"b", b"cd"]


def test_only_plain_stream_writers_are_made_batching():
    class Other:
        pass

    other = Other()
    assert sendbatch.batching(other) is other and type(other) is Other
    assert sendbatch.batching(None) is None


async def test_mitmproxy_connection_writers_batch_and_a_real_socket_gets_every_byte_in_order():
    assert sendbatch.install() and sendbatch.install()  # idempotent
    from mitmproxy.proxy import server

    received = bytearray()
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            received.extend(chunk)
        done.set()
        w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, family=socket.AF_INET)
    port = srv.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        io = server.ConnectionIO(handler=None, reader=reader, writer=writer)  # what mitmproxy stores per connection
        assert io.writer is writer and isinstance(writer, sendbatch.BatchingWriter)
        assert server.ConnectionIO(handler=None).writer is None
        expected = b"".join(b"event: e\ndata: {\"n\": %d}\n\n" % k for k in range(500))
        for k in range(500):
            writer.write(b"event: e\ndata: {\"n\": %d}\n\n" % k)
            if k % 97 == 0:
                await writer.drain()
        writer.write_eof()
        await asyncio.wait_for(done.wait(), 60)
        assert bytes(received) == expected
        writer.close()
    finally:
        srv.close()
        await srv.wait_closed()

