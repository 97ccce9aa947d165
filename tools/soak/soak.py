#!/usr/bin/env python3
"""Load and soak test for `laya-edge serve` over MQTT 5 (not run in CI; see README.md).

    soak.py flood --broker mqtt://127.0.0.1:18830 (--agent-pid PID | --agent-bin BIN --config FILE)
    soak.py burst --broker mqtt://127.0.0.1:18830 (--agent-pid PID | --agent-bin BIN --config FILE)

flood: N clients x M questions, QoS 1, Response Topic + Correlation Data, JSON and CBOR, a
fraction of invalid requests (each must get an error reply). burst: K large (~220 KB) requests at
once, the agent's RSS sampled every 50 ms. Both report answered / refused (by code) / lost /
duplicated, client-side round-trip p50/p99 and the RSS (VmRSS/VmHWM) of the agent and its worker.

Only loopback brokers are accepted. Every wait is bounded (a quiet timeout with no progress and
an overall cap), so the script stops by itself, also when the agent wedges.
Exit status: 0 all replied as expected, 1 lost/duplicated/unexpected replies, 2 setup failure.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import cbor2
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
CBOR = "application/cbor"
JSON = "application/json"


def now():
    return time.monotonic()


# ----------------------------------------------------------------------------------------------
# /proc readings


def proc_status(pid):
    """{'VmRSS': kB, 'VmHWM': kB} of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            out = {}
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0])
            return out
    except (OSError, ValueError):
        return None


def children(pid):
    pids = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids.update(int(x) for x in f.read().split())
    except OSError:
        # No /proc/PID/task/*/children: scan every process's parent.
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            pids.add(int(d))
                except (OSError, ValueError, IndexError):
                    pass
    return sorted(pids)


def worker_pid(agent):
    """The agent's child `laya-edge worker` (the newest if several), or None."""
    found = None
    for c in children(agent):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv:
            found = c
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Sampler(threading.Thread):
    """Samples the agent's and its worker's VmRSS every `interval` s; windows keep peaks."""

    def __init__(self, agent, interval):
        super().__init__(daemon=True)
        self.agent, self.interval = agent, interval
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.windows = {}  # name -> {"agent": peak kB, "worker": peak kB, "samples": n}
        self.open = set()
        self.worker_pids = []  # every worker pid seen, in order
        self.samples = 0

    def reading(self):
        a = proc_status(self.agent)
        w = worker_pid(self.agent)
        ws = proc_status(w) if w else None
        return a, w, ws

    def run(self):
        while not self.stop_ev.wait(self.interval):
            a, w, ws = self.reading()
            with self.lock:
                self.samples += 1
                if w and (not self.worker_pids or self.worker_pids[-1] != w):
                    self.worker_pids.append(w)
                for name in self.open:
                    win = self.windows[name]
                    win["samples"] += 1
                    if a:
                        win["agent"] = max(win["agent"], a["VmRSS"])
                    if ws:
                        win["worker"] = max(win["worker"], ws["VmRSS"])

    def begin(self, name):
        with self.lock:
            self.windows[name] = {"agent": 0, "worker": 0, "samples": 0}
            self.open.add(name)

    def end(self, name):
        with self.lock:
            self.open.discard(name)
            return dict(self.windows[name])

    def stop(self):
        self.stop_ev.set()


def snapshot(agent):
    a = proc_status(agent)
    w = worker_pid(agent)
    ws = proc_status(w) if w else None
    return {
        "agent_pid": agent,
        "agent_rss_kb": a and a["VmRSS"],
        "agent_hwm_kb": a and a["VmHWM"],
        "worker_pid": w,
        "worker_rss_kb": ws and ws["VmRSS"],
        "worker_hwm_kb": ws and ws["VmHWM"],
    }


def mib(kb):
    return "-" if kb is None or kb == 0 else f"{kb / 1024:.1f} MiB"


# ----------------------------------------------------------------------------------------------
# requests

STATES = [
    "I was charged twice for my order #{n}, please refund me.",
    "The app crashes when I log in (ticket {n}). I need this fixed today.",
    "We would like to buy {n} licenses for our team.",
    "My parcel {n} has not arrived after two weeks.",
]


def valid_request(rng, rid, n):
    qs = {}
    kinds = rng.sample(["noul", "choice", "score"], rng.randint(1, 3))
    for k in kinds:
        if k == "noul":
            qs["refund"] = {"type": "noul", "instructions": "Is the customer asking for a refund?"}
        elif k == "choice":
            qs["dept"] = {
                "type": "choice",
                "instructions": "Which department should handle this?",
                "criteria": ["billing", "technical", "sales", "shipping"],
            }
        else:
            qs["urgency"] = {
                "type": "score",
                "instructions": "How urgent is this?",
                "criteria": ["not urgent", "low", "medium", "high", "critical"],
            }
    return {"id": rid, "state": rng.choice(STATES).format(n=n), "questions": qs}


# Each invalid request must get an error reply: a top-level `error`, or (for a bad question in a
# well-formed request) `answers` whose every question carries an `error`.
INVALID_KINDS = [
    "bad_json",  # truncated JSON
    "bad_cbor",  # content type CBOR, bytes that are not CBOR
    "not_object",  # a JSON list
    "no_state",  # no 'state'
    "questions_list",  # 'questions' not an object
    "bad_max_len",  # 'max_len' a string
    "unknown_type",  # question type 'yesno' (an error in that question's place)
    "choice_no_criteria",  # a choice without options (an error in that question's place)
]


def invalid_request(rng, rid, n):
    """(kind, payload bytes, content type)."""
    kind = rng.choice(INVALID_KINDS)
    good = valid_request(rng, rid, n)
    if kind == "bad_json":
        return kind, json.dumps(good).encode()[:-7], JSON
    if kind == "bad_cbor":
        return kind, b"\xff\xfe\x1c" + os.urandom(8), CBOR
    if kind == "not_object":
        return kind, json.dumps([rid, n]).encode(), JSON
    if kind == "no_state":
        del good["state"]
    elif kind == "questions_list":
        good["questions"] = list(good["questions"])
    elif kind == "bad_max_len":
        good["max_len"] = "512"
    elif kind == "unknown_type":
        good["questions"] = {"q": {"type": "yesno", "instructions": "Is it?"}}
    elif kind == "choice_no_criteria":
        good["questions"] = {"q": {"type": "choice", "instructions": "Which one?"}}
    return kind, json.dumps(good).encode(), JSON


def encode(req, cbor):
    return (cbor2.dumps(req), CBOR) if cbor else (json.dumps(req).encode(), JSON)


def classify(reply):
    """('answered', None) | ('refused', code) | ('question_error', code) | ('undecodable', why)."""
    if not isinstance(reply, dict):
        return "undecodable", "not an object"
    if "error" in reply:
        err = reply["error"]
        return "refused", (err.get("code") if isinstance(err, dict) else None) or "?"
    answers = reply.get("answers")
    if isinstance(answers, dict):
        for a in answers.values():
            if isinstance(a, dict) and "error" in a:
                err = a["error"]
                return "question_error", (err.get("code") if isinstance(err, dict) else None) or "?"
        return "answered", None
    return "undecodable", "neither answers nor error"


# ----------------------------------------------------------------------------------------------
# clients


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.last_progress = now()
        self.stray = 0  # replies whose correlation data is not ours
        self.disconnects = 0


class Question:
    __slots__ = ("rid", "corr", "payload", "ctype", "invalid", "sent_at", "acked", "replies", "latency", "outcome")

    def __init__(self, rid, corr, payload, ctype, invalid):
        self.rid, self.corr, self.payload, self.ctype, self.invalid = rid, corr, payload, ctype, invalid
        self.sent_at = None
        self.acked = False
        self.replies = 0
        self.latency = None
        self.outcome = None  # (kind, code) of the first reply


class Asker:
    """One MQTT 5 client: its own reply topic, at most `window` questions unacknowledged by the
    broker (the next one is published on each PUBACK: as fast as the broker takes them)."""

    def __init__(self, args, host, port, name, questions, window, stats):
        self.args, self.name, self.questions, self.window, self.stats = args, name, questions, window, stats
        self.by_corr = {q.corr: q for q in questions}
        self.next = 0
        self.reply_base = args.reply_base.format(prefix=args.prefix, client=name)
        self.ask_topic = f"{args.prefix}/{args.device}/ask"
        self.ready = threading.Event()
        self.send_lock = threading.Lock()
        self.failed = None
        self.stopping = False
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
        c.max_inflight_messages_set(window)
        c.on_connect, c.on_subscribe, c.on_message = self.on_connect, self.on_subscribe, self.on_message
        c.on_publish, c.on_disconnect = self.on_publish, self.on_disconnect
        self.client = c
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0
        c.connect_async(host, port, keepalive=30, clean_start=True, properties=props)

    def start(self):
        self.client.loop_start()

    def on_connect(self, client, userdata, flags, rc, props):
        if rc.is_failure:
            self.failed = f"CONNACK {rc}"
            self.ready.set()
            return
        srv_max = getattr(props, "ReceiveMaximum", None)
        if srv_max and srv_max < self.window:
            self.window = srv_max
            client.max_inflight_messages_set(srv_max)
        client.subscribe(self.reply_base + "/#", qos=1)

    def on_subscribe(self, client, userdata, mid, rcs, props):
        if any(r.is_failure for r in rcs):
            self.failed = f"SUBACK {rcs}"
        self.ready.set()

    def go(self):
        """Publishes the first window (the rest follow the PUBACKs)."""
        for _ in range(self.window):
            self.publish_next()

    def publish_next(self):
        with self.send_lock:
            if self.stopping or self.next >= len(self.questions):
                return
            q = self.questions[self.next]
            self.next += 1
            q.sent_at = now()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = f"{self.reply_base}/{q.corr.hex()}" if self.args.topic_per_question else self.reply_base + "/r"
        props.CorrelationData = q.corr
        props.ContentType = q.ctype
        self.client.publish(self.ask_topic, q.payload, qos=1, properties=props)

    def on_publish(self, client, userdata, mid, rc, props):
        with self.stats.lock:
            self.stats.last_progress = now()
        self.publish_next()

    def on_message(self, client, userdata, msg):
        t = now()
        corr = getattr(msg.properties, "CorrelationData", None)
        q = self.by_corr.get(corr)
        with self.stats.lock:
            self.stats.last_progress = t
            if q is None:
                self.stats.stray += 1
                return
            q.replies += 1
            if q.replies > 1:
                return
            q.latency = t - q.sent_at if q.sent_at is not None else None
        try:
            if getattr(msg.properties, "ContentType", "") == CBOR:
                reply = cbor2.loads(msg.payload)
            else:
                reply = json.loads(msg.payload)
            q.outcome = classify(reply)
            rid = reply.get("id") if isinstance(reply, dict) else None
            if rid is not None and rid != q.rid:
                q.outcome = ("undecodable", f"id {rid!r} for {q.rid!r}")
        except Exception as e:  # noqa: BLE001 - any undecodable reply is counted, not fatal
            q.outcome = ("undecodable", type(e).__name__)

    def on_disconnect(self, client, userdata, flags, rc, props):
        if not self.stopping:
            with self.stats.lock:
                self.stats.disconnects += 1

    def close(self):
        self.stopping = True
        try:
            self.client.disconnect()
        except Exception:  # noqa: BLE001
            pass
        self.client.loop_stop()


class Monitor:
    """Watches the device's status, events and errors topics."""

    def __init__(self, args, host, port, run):
        self.status = None
        self.events, self.errors = [], 0
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        base = f"{args.prefix}/{args.device}"
        self.topics = {f"{base}/status": "status", f"{base}/events": "events", f"{base}/errors": "errors"}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"soak-{run}-monitor", protocol=mqtt.MQTTv5)
        c.on_connect = lambda cl, u, f, rc, p: [cl.subscribe(t, qos=1) for t in self.topics]
        c.on_message = self.on_message
        c.connect_async(host, port, keepalive=30, clean_start=True)
        c.loop_start()
        self.client = c

    def on_message(self, client, userdata, msg):
        kind = self.topics.get(msg.topic)
        try:
            if getattr(msg.properties, "ContentType", "") == CBOR:
                doc = cbor2.loads(msg.payload)
            else:
                doc = json.loads(msg.payload)
        except Exception:  # noqa: BLE001
            doc = None
        with self.lock:
            if kind == "status":
                self.status = doc
            elif kind == "events":
                self.events.append(doc)
            elif kind == "errors":
                self.errors += 1
            self.changed.notify_all()

    def wait_ready(self, timeout, min_birth=0):
        end = now() + timeout
        with self.lock:
            while True:
                s = self.status
                if isinstance(s, dict) and s.get("state") == "online" and s.get("backend_state") == "ready" \
                        and int(s.get("birth") or 0) >= min_birth:
                    return True
                left = end - now()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.5))

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


# ----------------------------------------------------------------------------------------------
# agent


class Agent:
    def __init__(self, args):
        self.proc = None
        if args.agent_pid:
            self.pid = args.agent_pid
            if not alive(self.pid):
                sys.exit(f"soak: no process {self.pid}")
        else:
            os.makedirs(os.path.dirname(os.path.abspath(args.agent_log)), exist_ok=True)
            self.log = open(args.agent_log, "ab")
            self.proc = subprocess.Popen(
                [args.agent_bin, "serve", "--config", args.config],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            )
            self.pid = self.proc.pid

    def exited(self):
        if self.proc is not None:
            return self.proc.poll()
        return None if alive(self.pid) else "gone"

    def stop(self, grace):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc and self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


# ----------------------------------------------------------------------------------------------
# a round


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]


def run_round(args, host, port, run, rnd, agent, sampler, plan):
    """plan: list (one per client) of lists of Question. Returns the round's report dict."""
    stats = Stats()
    window = args.window if args.mode == "flood" else max(len(qs) for qs in plan)
    askers = [Asker(args, host, port, f"soak-{run}-r{rnd}-c{i}", qs, window, stats) for i, qs in enumerate(plan)]
    for a in askers:
        a.start()
    deadline = now() + args.connect_timeout
    for a in askers:
        if not a.ready.wait(max(0.0, deadline - now())) or a.failed:
            for b in askers:
                b.close()
            raise SystemExit(f"soak: client {a.name} could not connect/subscribe: {a.failed or 'timeout'}")
    total = sum(len(qs) for qs in plan)
    sampler.begin("run")
    t0 = now()
    with stats.lock:
        stats.last_progress = t0
    for a in askers:
        a.go()
    why = "all replied"
    while True:
        time.sleep(0.05)
        with stats.lock:
            replied = sum(1 for a in askers for q in a.questions if q.replies)
            quiet = now() - stats.last_progress
        if replied >= total:
            break
        if quiet > args.quiet_timeout:
            why = f"quiet for {args.quiet_timeout:g} s"
            break
        if now() - t0 > args.max_seconds:
            why = f"--max-seconds {args.max_seconds:g} reached"
            break
        if agent.exited() is not None:
            # Replies in flight at the broker may still come: wait a little, then stop.
            time.sleep(min(2.0, args.quiet_timeout))
            why = f"agent exited ({agent.exited()})"
            break
    t_end = now()
    # A short grace for duplicates arriving right after the last reply.
    time.sleep(args.dup_grace)
    peak = sampler.end("run")
    right_after = snapshot(agent.pid)
    for a in askers:
        a.close()
    qs = [q for a in askers for q in a.questions]
    rep = {
        "round": rnd,
        "stopped": why,
        "seconds": round(t_end - t0, 3),
        "questions": total,
        "valid": sum(not q.invalid for q in qs),
        "invalid": sum(bool(q.invalid) for q in qs),
        "json": sum(q.ctype == JSON for q in qs),
        "cbor": sum(q.ctype == CBOR for q in qs),
        "not_sent": sum(q.sent_at is None for q in qs),
        "lost": sum(q.sent_at is not None and q.replies == 0 for q in qs),
        "duplicated": sum(q.replies > 1 for q in qs),
        "extra_replies": sum(max(0, q.replies - 1) for q in qs),
        "stray_replies": stats.stray,
        "client_disconnects": stats.disconnects,
        "peak_agent_rss_kb": peak["agent"],
        "peak_worker_rss_kb": peak["worker"],
        "rss_samples": peak["samples"],
        "right_after": right_after,
    }
    counts = {"answered": 0, "refused": {}, "question_error": {}, "undecodable": {}}
    inv = {"error_reply": 0, "answered_without_error": 0, "lost": 0, "by_kind": {}}
    lats = []
    for q in qs:
        if q.latency is not None:
            lats.append(q.latency * 1000)
        if q.outcome:
            kind, code = q.outcome
            if kind == "answered":
                counts["answered"] += 1
            else:
                counts[kind][code] = counts[kind].get(code, 0) + 1
        if q.invalid:
            k = inv["by_kind"].setdefault(q.invalid, {"sent": 0, "error_reply": 0, "answered": 0, "lost": 0})
            k["sent"] += 1
            if q.outcome is None:
                if q.sent_at is not None:
                    inv["lost"] += 1
                    k["lost"] += 1
            elif q.outcome[0] in ("refused", "question_error"):
                inv["error_reply"] += 1
                k["error_reply"] += 1
            else:
                inv["answered_without_error"] += 1
                k["answered"] += 1
    rep["replies"] = counts
    rep["invalid_outcomes"] = inv
    rep["valid_answered"] = sum(1 for q in qs if not q.invalid and q.outcome and q.outcome[0] == "answered")
    rep["valid_with_error"] = sum(1 for q in qs if not q.invalid and q.outcome and q.outcome[0] != "answered")
    rep["latency_ms"] = {
        "n": len(lats),
        "p50": percentile(lats, 50) and round(percentile(lats, 50), 2),
        "p99": percentile(lats, 99) and round(percentile(lats, 99), 2),
        "max": round(max(lats), 2) if lats else None,
    }
    rep["throughput_per_s"] = round(len(lats) / (t_end - t0), 1) if t_end > t0 else None
    return rep


def flood_plan(args, run, rnd, rng):
    plan = []
    for c in range(args.clients):
        qs = []
        for s in range(args.questions):
            rid = f"{run}-r{rnd}-c{c}-{s}"
            corr = f"{run}:{rnd}:{c}:{s}".encode()
            n = rng.randrange(10**9)
            if rng.random() < args.invalid_fraction:
                kind, payload, ctype = invalid_request(rng, rid, n)
                qs.append(Question(rid, corr, payload, ctype, kind))
            else:
                payload, ctype = encode(valid_request(rng, rid, n), rng.random() < args.cbor_fraction)
                qs.append(Question(rid, corr, payload, ctype, None))
        plan.append(qs)
    return plan


def burst_plan(args, run, rnd, rng):
    clients = min(args.clients, args.burst)
    plan = [[] for _ in range(clients)]
    sizes = []
    for i in range(args.burst):
        rid = f"{run}-r{rnd}-b{i}"
        corr = f"{run}:{rnd}:b:{i}".encode()
        state = {f"k{j:05d}": rng.randrange(10**7, 10**8) for j in range(args.state_keys)}
        req = valid_request(rng, rid, i)
        names = list(req["questions"])[: rng.randint(1, 2)]
        req = {"id": rid, "state": state, "questions": {k: req["questions"][k] for k in names}}
        payload, ctype = encode(req, rng.random() < args.cbor_fraction)
        if len(payload) > args.max_payload:
            sys.exit(f"soak: a burst request is {len(payload)} bytes, above --max-payload {args.max_payload}: "
                     "lower --state-keys")
        sizes.append(len(payload))
        plan[i % clients].append(Question(rid, corr, payload, ctype, None))
    return plan, sizes


def print_round(args, rep, idle, after):
    r = rep["replies"]
    print(f"-- round {rep['round']}: {rep['questions']} requests ({rep['valid']} valid, {rep['invalid']} invalid; "
          f"{rep['json']} JSON, {rep['cbor']} CBOR) in {rep['seconds']} s, stopped: {rep['stopped']}")
    print(f"   answered      {r['answered']}")
    print(f"   refused       {sum(r['refused'].values())} {json.dumps(r['refused'], sort_keys=True)}")
    print(f"   question err  {sum(r['question_error'].values())} {json.dumps(r['question_error'], sort_keys=True)}")
    if r["undecodable"]:
        print(f"   undecodable   {sum(r['undecodable'].values())} {json.dumps(r['undecodable'], sort_keys=True)}")
    print(f"   lost          {rep['lost']}   (sent, no reply)" + (f"; not sent {rep['not_sent']}" if rep["not_sent"] else ""))
    print(f"   duplicated    {rep['duplicated']} ({rep['extra_replies']} extra replies); stray replies {rep['stray_replies']};"
          f" client disconnects {rep['client_disconnects']}")
    inv = rep["invalid_outcomes"]
    if rep["invalid"]:
        print(f"   invalid       {inv['error_reply']} got an error reply, {inv['answered_without_error']} answered without "
              f"error, {inv['lost']} lost")
        odd = {k: v for k, v in sorted(inv["by_kind"].items()) if v["answered"] or v["lost"]}
        if odd:
            print(f"   invalid kinds without an error reply: {json.dumps(odd)}")
    if rep["valid_with_error"]:
        print(f"   valid with an error reply: {rep['valid_with_error']}")
    lat = rep["latency_ms"]
    print(f"   latency       p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms (n={lat['n']}, "
          f"{rep['throughput_per_s']} replies/s)")
    print(f"   agent RSS     idle {mib(idle['agent_rss_kb'])}, peak {mib(rep['peak_agent_rss_kb'])} "
          f"({rep['rss_samples']} samples), right after {mib(rep['right_after']['agent_rss_kb'])}, "
          f"after {args.after_s:g} s {mib(after['agent_rss_kb'])}; VmHWM {mib(after['agent_hwm_kb'])}")
    print(f"   worker RSS    idle {mib(idle['worker_rss_kb'])}, peak {mib(rep['peak_worker_rss_kb'])}, "
          f"right after {mib(rep['right_after']['worker_rss_kb'])}, after {args.after_s:g} s "
          f"{mib(after['worker_rss_kb'])}; VmHWM {mib(after['worker_hwm_kb'])} (pid {after['worker_pid']})")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["flood", "burst"])
    p.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="mqtt://HOST:PORT, loopback only")
    p.add_argument("--device", default="soak")
    p.add_argument("--prefix", default="laya/v1")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--agent-pid", type=int, help="attach to a running `laya-edge serve`")
    g.add_argument("--agent-bin", help="start `AGENT_BIN serve --config CONFIG` (stopped with SIGTERM at the end)")
    p.add_argument("--config", help="with --agent-bin")
    p.add_argument("--agent-log", default=None, help="the started agent's stdout+stderr (default target/soak/agent.log)")
    p.add_argument("--clients", type=int, default=None, help="flood: 50; burst: 16 (requests split among them)")
    p.add_argument("--questions", type=int, default=400, help="flood: requests per client")
    p.add_argument("--window", type=int, default=20,
                   help="flood: requests a client has unacknowledged by the broker (capped by its Receive Maximum)")
    p.add_argument("--cbor-fraction", type=float, default=None, help="flood: 0.3; burst: 0")
    p.add_argument("--invalid-fraction", type=float, default=0.05, help="flood")
    p.add_argument("--burst", type=int, default=64, help="burst: concurrent requests (the agent's limits.queue)")
    p.add_argument("--state-keys", type=int, default=11000, help="burst: keys of each request's state (~20 B each)")
    p.add_argument("--max-payload", type=int, default=262144, help="the agent's mqtt.max_payload")
    p.add_argument("--rounds", type=int, default=1, help="repeat the mode this many times (RSS after each)")
    p.add_argument("--sample-ms", type=float, default=None, help="RSS sampling period (flood 100, burst 50)")
    p.add_argument("--after-s", type=float, default=None, help="RSS reading this long after a round (flood 5, burst 60)")
    p.add_argument("--idle-s", type=float, default=2.0, help="wait before the idle RSS reading")
    p.add_argument("--quiet-timeout", type=float, default=30.0,
                   help="stop waiting after this long with no reply and no PUBACK: the rest is lost")
    p.add_argument("--max-seconds", type=float, default=900.0, help="cap on one round's sending and waiting")
    p.add_argument("--connect-timeout", type=float, default=20.0)
    p.add_argument("--ready-timeout", type=float, default=120.0, help="wait for the agent's status to be ready")
    p.add_argument("--dup-grace", type=float, default=1.0, help="keep listening this long after the last reply")
    p.add_argument("--reply-base", default="{prefix}/reply/{client}",
                   help="each client's response topics are under this ({prefix}, {client}); it must match "
                        "the agent's mqtt.response_topics")
    p.add_argument("--topic-per-question", action="store_true",
                   help="a response topic per question (reply/<corr>) instead of one per client (reply/r)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the report as JSON to this file")
    args = p.parse_args()

    flood = args.mode == "flood"
    args.clients = args.clients or (50 if flood else 16)
    args.cbor_fraction = (0.3 if flood else 0.0) if args.cbor_fraction is None else args.cbor_fraction
    args.sample_ms = args.sample_ms or (100 if flood else 50)
    args.after_s = (5.0 if flood else 60.0) if args.after_s is None else args.after_s
    if not flood:
        args.invalid_fraction = 0.0
    here = os.path.dirname(os.path.abspath(__file__))
    args.agent_log = args.agent_log or os.path.join(here, "..", "..", "target", "soak", "agent.log")
    bounds = [(args.clients, 1, 1000, "--clients"), (args.questions, 1, 100000, "--questions"),
              (args.burst, 1, 10000, "--burst"), (args.rounds, 1, 1000, "--rounds"), (args.window, 1, 65535, "--window")]
    for v, lo, hi, name in bounds:
        if not lo <= v <= hi:
            sys.exit(f"soak: {name} must be in {lo}..{hi}")
    if args.agent_bin and not args.config:
        sys.exit("soak: --agent-bin needs --config")

    url = urlparse(args.broker)
    host, port = url.hostname or "127.0.0.1", url.port or 1883
    if url.scheme != "mqtt" or host not in LOOPBACK:
        sys.exit(f"soak: only mqtt:// brokers on loopback (127.0.0.1, localhost), not {args.broker}")

    run = f"{int(time.time()) % 100000:05d}{os.getpid() % 1000:03d}"
    rng = random.Random(args.seed)
    spawn_ms = int(time.time() * 1000) - 2000
    agent = Agent(args)
    monitor = Monitor(args, host, port, run)
    report = {"mode": args.mode, "broker": f"{host}:{port}", "device": args.device, "agent_pid": agent.pid,
              "args": {k: v for k, v in vars(args).items() if k not in ("json",)}, "rounds": []}
    code = 0
    try:
        if not monitor.wait_ready(args.ready_timeout if agent.proc else min(args.ready_timeout, 10),
                                  spawn_ms if agent.proc else 0):
            if agent.proc:
                raise SystemExit(f"soak: the agent is not ready after {args.ready_timeout:g} s "
                                 f"(status {monitor.status}); see {args.agent_log}")
            print(f"soak: warning: no ready status from device {args.device!r} (status {monitor.status})")
        print(f"soak {args.mode}: broker {host}:{port}, device {args.device}, agent pid {agent.pid}"
              f"{' (started: ' + args.agent_log + ')' if agent.proc else ' (attached)'}, "
              f"worker pid {worker_pid(agent.pid)}")
        if flood:
            print(f"  {args.clients} clients x {args.questions} requests, window {args.window}, "
                  f"CBOR {args.cbor_fraction:g}, invalid {args.invalid_fraction:g}, {args.rounds} round(s)")
        sampler = Sampler(agent.pid, args.sample_ms / 1000)
        sampler.start()
        for rnd in range(args.rounds):
            time.sleep(args.idle_s)
            idle = snapshot(agent.pid)
            if flood:
                plan = flood_plan(args, run, rnd, rng)
            else:
                plan, sizes = burst_plan(args, run, rnd, rng)
                print(f"  burst of {args.burst} requests over {len(plan)} clients, {args.state_keys} state keys, "
                      f"{min(sizes)}-{max(sizes)} bytes each ({sum(sizes) / 1048576:.1f} MiB in all)")
            rep = run_round(args, host, port, run, rnd, agent, sampler, plan)
            end = now() + args.after_s
            while now() < end and agent.exited() is None:
                time.sleep(min(0.5, max(0.0, end - now())))
            after = snapshot(agent.pid)
            rep["idle"], rep["after"] = idle, after
            report["rounds"].append(rep)
            print_round(args, rep, idle, after)
            if rep["lost"] or rep["duplicated"] or rep["not_sent"] or rep["invalid_outcomes"]["answered_without_error"] \
                    or rep["invalid_outcomes"]["lost"] or rep["valid_with_error"] or rep["replies"]["undecodable"]:
                code = 1
            if agent.exited() is not None:
                print(f"soak: the agent exited ({agent.exited()}): stopping")
                code = 1
                break
        sampler.stop()
        with monitor.lock:
            events = [e.get("event") if isinstance(e, dict) else e for e in monitor.events]
            report["events"], report["errors_topic"] = monitor.events, monitor.errors
            report["worker_pids"] = sampler.worker_pids
        print(f"agent events: {events or 'none'}; messages on the errors topic: {report['errors_topic']}; "
              f"worker pids seen: {sampler.worker_pids}")
    finally:
        monitor.close()
        if agent.proc:
            rc = agent.stop(45)
            report["agent_exit"] = rc
            print(f"agent stopped (SIGTERM): exit status {rc}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    sys.exit(code)


if __name__ == "__main__":
    main()
