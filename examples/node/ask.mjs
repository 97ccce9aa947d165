#!/usr/bin/env node
// Ask a laya-edge device one question request over MQTT 5 and print its reply as JSON.
//
//   node ask.mjs --broker mqtt://localhost:1883 --device board-7 [--cbor] '{"id": "r1", ...}'
//
// The request goes to {prefix}/{device}/ask with a response topic, {prefix}/reply/{user}/{random
// key} (the user name the broker's ACL lets read it; the client id without a login), and random
// correlation data; the reply is the message on that topic carrying the same correlation data,
// JSON or CBOR as its content type says. A reply someone else made a device send here (naming
// this topic as their question's response topic) carries their correlation data and is ignored
// (docs/security.md). Exit status 0 with a reply (an error reply included), 1 without.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import mqtt from "mqtt";
import { decode, encode } from "cbor2";

const { values: opt, positionals } = parseArgs({
  options: {
    broker: { type: "string", default: "mqtt://localhost:1883" },
    device: { type: "string" },
    prefix: { type: "string", default: "laya/v1" },
    cbor: { type: "boolean", default: false },
    timeout: { type: "string", default: "30" },
    username: { type: "string" },
    "password-file": { type: "string" },
  },
  allowPositionals: true,
});
if (!opt.device || positionals.length !== 1) {
  console.error("usage: ask.mjs --device ID [--broker URL] [--prefix P] [--cbor] [--username U [--password-file F]] REQUEST_JSON");
  process.exit(2);
}
const request = JSON.parse(positionals[0]);
const clientId = `ask-node-${randomBytes(6).toString("hex")}`;
const correlation = randomBytes(16);
const replyTopic = `${opt.prefix}/reply/${opt.username ?? clientId}/${randomBytes(16).toString("hex")}`;
const login = opt.username === undefined ? {} : { username: opt.username };
if (opt["password-file"] !== undefined) {
  login.password = readFileSync(opt["password-file"], "utf8").replace(/[\r\n]+$/, "");
}

let answered = false;
const client = mqtt.connect(opt.broker, { clientId, protocolVersion: 5, ...login });
const timer = setTimeout(() => {
  console.error(`no reply within ${opt.timeout} s`);
  process.exit(1);
}, Number(opt.timeout) * 1000);

client.on("connect", async () => {
  await client.subscribeAsync(replyTopic, { qos: 1 });
  const contentType = opt.cbor ? "application/cbor" : "application/json";
  const body = opt.cbor ? Buffer.from(encode(request)) : JSON.stringify(request);
  await client.publishAsync(`${opt.prefix}/${opt.device}/ask`, body, {
    qos: 1,
    properties: { responseTopic: replyTopic, correlationData: correlation, contentType },
  });
});
client.on("message", (topic, payload, packet) => {
  const props = packet.properties ?? {};
  if (!props.correlationData || !correlation.equals(props.correlationData)) return; // not ours
  const reply = props.contentType === "application/cbor" ? decode(payload) : JSON.parse(payload.toString("utf8"));
  console.log(JSON.stringify(reply));
  answered = true;
  clearTimeout(timer);
  client.end(false, {}, () => process.exit(0));
});
client.on("error", (e) => {
  if (answered) return; // the connection closing after the reply
  console.error(`broker: ${e.message}`);
  process.exit(1);
});
