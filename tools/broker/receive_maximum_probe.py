#!/usr/bin/env python3
"""Does an MQTT 5 broker honour a client's Receive Maximum?

Usage:  python3 tools/broker/receive_maximum_probe.py HOST PORT [USER PASSWORD]

laya-edge announces a Receive Maximum of `limits.queue` so that the broker keeps the rest of a
flood in the agent's session and a fleet member holds at most that many unacknowledged. This probe connects a subscriber that announces a Receive Maximum of 5 and never
acknowledges, publishes 50 QoS 1 messages to a probe topic, then acknowledges one message at a
time: a broker that honours the Receive Maximum sends 5 at first and one more per
acknowledgement. mosquitto before 2.0.13 sends a whole new window per acknowledgement
(eclipse/mosquitto#2306, fixed in 2.0.13): this probe then reports `does not honour`.

Plain sockets and the MQTT 5 wire format only (no client library), so it runs on any Python 3.
Exit status: 0 honours, 1 does not, 2 could not probe.
"""
import socket
import struct
import sys
import time
import uuid

WINDOW = 5
MESSAGES = 50


def varint(n):
    out = b""
    while True:
        b, n = n % 128, n // 128
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def utf8(s):
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def packet(kind, body):
    return bytes([kind]) + varint(len(body)) + body


def connect(host, port, client_id, props=b"", user=None, password=None):
    flags = 0x02  # clean start
    payload = utf8(client_id)
    if user is not None:
        flags |= 0x80 | 0x40
        payload += utf8(user) + utf8(password or "")
    body = utf8("MQTT") + bytes([5, flags]) + struct.pack(">H", 60) + varint(len(props)) + props + payload
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(packet(0x10, body))
    kind, rest = read_packet(s)
    if kind >> 4 != 2 or rest[1] != 0:
        raise RuntimeError(f"CONNACK refused: {rest[1:2].hex()}")
    return s


def read_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise RuntimeError("connection closed")
        data += chunk
    return data


def read_packet(s):
    kind = read_exact(s, 1)[0]
    n, shift = 0, 0
    while True:
        b = read_exact(s, 1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return kind, read_exact(s, n)


def publishes(s, wait):
    """Packet ids of the QoS 1 PUBLISHes that arrive within `wait` seconds."""
    ids = []
    s.settimeout(wait)
    try:
        while True:
            kind, body = read_packet(s)
            if kind >> 4 == 3:
                topic_len = struct.unpack(">H", body[:2])[0]
                ids.append(struct.unpack(">H", body[2 + topic_len : 4 + topic_len])[0])
    except socket.timeout:
        return ids


def main():
    if len(sys.argv) not in (3, 5):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    host, port = sys.argv[1], int(sys.argv[2])
    user, password = (sys.argv[3], sys.argv[4]) if len(sys.argv) == 5 else (None, None)
    topic = f"laya-probe/{uuid.uuid4().hex}"
    try:
        sub = connect(host, port, "probe-sub-" + topic[-8:], b"\x21" + struct.pack(">H", WINDOW), user, password)
        sub.sendall(packet(0x82, struct.pack(">H", 1) + b"\x00" + utf8(topic) + b"\x01"))
        if read_packet(sub)[0] >> 4 != 9:
            raise RuntimeError("no SUBACK")
        pub = connect(host, port, "probe-pub-" + topic[-8:], b"", user, password)
        for i in range(MESSAGES):
            pub.sendall(packet(0x32, utf8(topic) + struct.pack(">H", i + 1) + b"\x00" + b"x"))
        time.sleep(0.5)
        first = publishes(sub, 1.0)
        after = []
        for pid in first[:3]:
            sub.sendall(packet(0x40, struct.pack(">H", pid)))
            after.append(len(publishes(sub, 0.5)))
    except (OSError, RuntimeError) as e:
        print(f"could not probe {host}:{port}: {e}")
        return 2
    honours = len(first) == WINDOW and all(n <= 1 for n in after)
    print(
        f"Receive Maximum {WINDOW}: {len(first)} messages before any acknowledgement, "
        f"then {after} per acknowledgement: the broker {'honours' if honours else 'does not honour'} it"
    )
    return 0 if honours else 1


if __name__ == "__main__":
    sys.exit(main())
