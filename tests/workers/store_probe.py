"""Connects to HOST PORT as a TCPStore client would (VALIDATE, then PING) and
prints what happened: `refused` (no connection), `closed` (connected, then
closed by the server without a reply) or `answered`.
"""
import socket
import struct
import sys

host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=5)
except OSError as e:
    print(f"refused {e}")
    sys.exit(0)
s.settimeout(5)
try:
    s.sendall(struct.pack("<BI", 0, 0x3C85F7CE) + struct.pack("<BI", 13, 42))
    reply = s.recv(4)
except OSError:
    reply = b""
print("answered" if reply == struct.pack("<I", 42) else "closed")
