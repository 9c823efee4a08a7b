import socket, sys, time
host, key, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.create_connection((host, 6379), 5)
while time.time() < start_at:
    time.sleep(0.001)
t = time.perf_counter()
s.sendall(f"*2\r\n$3\r\nGET\r\n${len(key)}\r\n{key}\r\n".encode())
buf = b""
while b"\r\n" not in buf:
    buf += s.recv(65536)
head, rest = buf.split(b"\r\n", 1)
n = int(head[1:])
got = len(rest)
while got < n + 2:
    got += len(s.recv(1 << 20))
dt = time.perf_counter() - t
print(f"GET {key}: {n} bytes in {dt:.3f} s = {n * 8 / dt / 1e6:.1f} Mbit/s")
