#!/usr/bin/env python3
"""Ask a laya-edge device one question request over MQTT 5 and print its reply as JSON.

    python ask.py --broker mqtt://localhost:1883 --device board-7 [--cbor] '{"id": "r1", ...}'

The request goes to {prefix}/{device}/ask with a response topic, {prefix}/reply/{user}/{random
key} (the user name the broker's ACL lets read it; the client id without a login), and random
correlation data; the reply is the message on that topic carrying the same correlation data,
JSON or CBOR as its content type says. Anyone may make a device answer on this topic by naming
it as the response topic of a question of their own: that reply carries their correlation data
and is ignored (docs/security.md). Exit status 0 with a reply (an error reply included: it is
printed too), 1 without.
"""
import argparse, json, sys, threading, uuid
from urllib.parse import urlparse

import cbor2
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--broker", default="mqtt://localhost:1883")
p.add_argument("--device", required=True)
p.add_argument("--prefix", default="laya/v1")
p.add_argument("--cbor", action="store_true", help="send CBOR instead of JSON")
p.add_argument("--timeout", type=float, default=30.0)
p.add_argument("--username", help="log in as this user (its replies come under {prefix}/reply/{user}/)")
p.add_argument("--password-file", help="a file holding the password (trailing newlines trimmed)")
p.add_argument("request", help="the request, as JSON")
args = p.parse_args()

request = json.loads(args.request)
url = urlparse(args.broker)
client_id = f"ask-py-{uuid.uuid4().hex[:12]}"
correlation = uuid.uuid4().bytes
reply_topic = f"{args.prefix}/reply/{args.username or client_id}/{uuid.uuid4().hex}"
done, reply = threading.Event(), {}


def on_connect(client, userdata, flags, reason_code, properties):
    client.subscribe(reply_topic, qos=1)


def on_subscribe(client, userdata, mid, reason_codes, properties):
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = reply_topic
    props.CorrelationData = correlation
    props.ContentType = "application/cbor" if args.cbor else "application/json"
    body = cbor2.dumps(request) if args.cbor else json.dumps(request).encode()
    client.publish(f"{args.prefix}/{args.device}/ask", body, qos=1, properties=props)


def on_message(client, userdata, msg):
    if getattr(msg.properties, "CorrelationData", None) != correlation:
        return  # someone else's reply
    cbor = getattr(msg.properties, "ContentType", "") == "application/cbor"
    reply["value"] = cbor2.loads(msg.payload) if cbor else json.loads(msg.payload)
    done.set()


client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
if args.username:
    password = None
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            password = f.read().rstrip("\r\n")
    client.username_pw_set(args.username, password)
client.connect(url.hostname or "localhost", url.port or 1883)
client.loop_start()
ok = done.wait(args.timeout)
client.disconnect()
client.loop_stop()
if not ok:
    sys.exit(f"no reply within {args.timeout} s")
print(json.dumps(reply["value"], ensure_ascii=False))
