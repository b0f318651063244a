#!/usr/bin/env python3
"""Prints N free TCP ports on 127.0.0.1, space-separated (all held open until printed, so no two
are the same). Usage: tests/cluster/ports.py N   (up.sh and kueue.sh read them with `read -r`)."""
import socket
import sys

socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
