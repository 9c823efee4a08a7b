import socket, statistics, sys, time
def rtts(host, n=30):
    s = socket.create_connection((host, 6379), 5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(n):
        t = time.perf_counter(); s.sendall(b"PING\r\n"); assert s.recv(64) == b"+PONG\r\n"
        out.append((time.perf_counter() - t) * 1000)
    s.close()
    return out
for host in sys.argv[1:]:
    r = rtts(host)
    print(f"{host}: PING round trip over {len(r)}: median {statistics.median(r):.2f} ms, min {min(r):.2f} ms, max {max(r):.2f} ms")
