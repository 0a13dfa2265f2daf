"""A stand-in `ktserver` for client libraries' own test suites (conformance runs).

ukt's suite starts its server as ``$KT_BINARY -le -host H -port P [options] DB...`` and
connects to H:P. This shim accepts that command line and forwards every connection on
H:P to the Mercury KT listener named by ``$MERCURY_KT`` (HOST:PORT), byte for byte, until
SIGTERM. It starts in a fraction of a second (the suite waits two seconds at most), and
one Mercury root serves every server the suite starts. Loopback only; each connection
is bounded by an idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

IDLE_S = 120.0


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await asyncio.wait_for(reader.read(1 << 16), IDLE_S)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, TimeoutError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def main(argv: list[str]) -> None:
    host = argv[argv.index("-host") + 1] if "-host" in argv else "127.0.0.1"
    port = int(argv[argv.index("-port") + 1])
    thost, tport = os.environ["MERCURY_KT"].rsplit(":", 1)

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await asyncio.open_connection(thost, int(tport))
        except OSError:
            w.close()
            return
        await asyncio.gather(_pump(r, tw), _pump(tr, w))

    server = await asyncio.start_server(handle, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
