"""RFC 9113 §5.1.2: a stream opened past our SETTINGS_MAX_CONCURRENT_STREAMS is a stream error
(REFUSED_STREAM). That stream alone is reset, never processed (safe to retry); the requests
already in flight on the connection are answered, and the connection serves on."""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.events
from h2.errors import ErrorCodes

from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.h2server import serve
from tests.transport.transport_util import run

LIMIT = 4


class Careless(h2.connection.H2Connection):
    """A client that opens streams past the server's limit (h2 would stop at it)."""

    @property
    def open_outbound_streams(self) -> int:
        return 0


def test_streams_past_the_limit_are_refused_one_by_one_and_the_rest_are_answered() -> None:
    release = asyncio.Event()
    handled: list[str] = []

    async def slow(request: Request) -> Response:
        handled.append(request.path)
        await release.wait()
        return Response(200, request.path.encode())

    async def scenario() -> tuple[dict[int, int], dict[int, bytes], list[str], bool, bytes]:
        server = await serve(slow, "127.0.0.1", 0, ssl=None, insecure=True, limits=Limits(max_streams=LIMIT))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        conn = Careless(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        resets: dict[int, int] = {}
        bodies: dict[int, bytes] = {}
        ended = False

        async def pump(until) -> None:
            nonlocal ended
            while not until():
                data = await asyncio.wait_for(reader.read(65536), 10)
                if not data:
                    ended = True
                    return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamReset):
                        resets[event.stream_id] = event.error_code
                    elif isinstance(event, h2.events.DataReceived):
                        bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        ended = True
                        return
                writer.write(conn.data_to_send())

        await pump(lambda: conn.remote_settings.max_concurrent_streams == LIMIT)

        def get(path: str) -> int:
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, [(":method", "GET"), (":path", f"/{path}"), (":scheme", "http"),
                                          (":authority", "127.0.0.1")], end_stream=True)
            return stream_id

        ids = [get(f"r{i}") for i in range(LIMIT + 2)]
        writer.write(conn.data_to_send())
        await pump(lambda: len(resets) >= 2 or ended)
        release.set()
        await pump(lambda: all(i in bodies or i in resets for i in ids) or ended)
        again = get("again")
        writer.write(conn.data_to_send())
        await pump(lambda: again in bodies or ended)
        writer.close()
        server.close()
        return resets, bodies, list(handled), ended, bodies.get(again, b"")

    resets, bodies, handled, ended, again = run(scenario())
    assert not ended, "the connection was ended"
    assert sorted(resets.values()) == [ErrorCodes.REFUSED_STREAM] * 2
    assert len(bodies) == LIMIT + 1 and again == b"again"
    assert sorted(handled) == sorted([*(f"r{i}" for i in range(LIMIT + 2) if 2 * i + 1 not in resets), "again"])
