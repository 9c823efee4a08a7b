#!/usr/bin/env python3
"""sonic-delay: a TCP relay that holds every byte a client sends for a fixed time before passing it
on; what comes back passes at once. A plain delay line in front of a server, for the container
testbed, where the kernel cannot add delay (no netem): each request reaches the server DELAY_MS
later, so every request/response exchange takes DELAY_MS more, and a stream's rate is left to the
links (deploy/cluster.sh shapes them). It knows nothing of what passes through it.

    sonic-delay --listen 127.0.0.1:8333 --to sonic-store:8333 --delay-ms 400

Installed in sonic-agent-host as /usr/local/bin/sonic-delay; sonic-link starts it when
SONIC_LINK_STORE_DELAY_MS is set.
"""

import argparse
import asyncio
import sys
import time


def address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"HOST:PORT, not {text!r}")
    return host, int(port)


async def forward(writer, data):
    """Passes `data` on, or the end of the stream when it is empty; False at the end."""
    if not data:
        if writer.can_write_eof():
            writer.write_eof()
        return False
    writer.write(data)
    await writer.drain()
    return True


async def delayed(reader, writer, delay):
    """Copies reader to writer, every chunk sent `delay` seconds after it arrived."""
    queue = asyncio.Queue()

    async def take():
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def give():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not await forward(writer, data):
                return

    await asyncio.gather(take(), give())


async def plain(reader, writer):
    while await forward(writer, await reader.read(65536)):
        pass


async def serve(args):
    delay = args.delay_ms / 1000.0

    async def client(c_reader, c_writer):
        try:
            s_reader, s_writer = await asyncio.open_connection(*args.to)
        except OSError as e:
            print(f"sonic-delay: cannot reach {args.to[0]}:{args.to[1]}: {e}", file=sys.stderr)
            c_writer.close()
            return
        try:
            await asyncio.gather(delayed(c_reader, s_writer, delay), plain(s_reader, c_writer))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (s_writer, c_writer):
                w.close()

    server = await asyncio.start_server(client, *args.listen)
    print(
        f"sonic-delay: {args.listen[0]}:{args.listen[1]} -> {args.to[0]}:{args.to[1]}, "
        f"client bytes held {args.delay_ms:g} ms",
        file=sys.stderr,
        flush=True,
    )
    async with server:
        await server.serve_forever()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", type=address, required=True)
    p.add_argument("--to", type=address, required=True)
    p.add_argument("--delay-ms", type=float, required=True)
    args = p.parse_args()
    if not (0 <= args.delay_ms <= 60000):
        p.error("--delay-ms: between 0 and 60000")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
