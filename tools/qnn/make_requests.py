#!/usr/bin/env python3
"""Requests for calibration and the fidelity report, and the split between the two.

Standard library only (runs in any python3).

    make_requests.py generate --out FILE [--n 240] [--seed 0]
        Writes N generated requests (JSON lines, {"id", "state", "questions"}): states from a few words
        to ~200 words (plain text, objects, conversation lists), so their rows fill both the 128- and
        the 256-token graphs, and every question type (noul, choice with 2-6 options, score with 3-5
        levels). Used when the user gives no requests of their own. They are not realistic traffic:
        calibrating on the user's own requests is better.

    make_requests.py split --requests FILE --cal CAL --heldout HELD [--every 3]
        Every `every`-th request goes to HELD (the fidelity report's rows), the rest to CAL (the
        quantizer's calibration rows): a held-out request is never seen by the quantizer.
        Accepts a request per line or {"request": ...} per line (tests/fixtures/demo/heldout.jsonl).
"""
import argparse
import json
import random

SUBJECTS = ["the upload", "my invoice", "the delivery", "the mobile app", "my account", "the password reset",
            "the new router", "the subscription", "the refund", "the login page", "the printer driver",
            "the monthly report", "the shipping label", "the warranty claim", "the API key", "the backup job"]
PROBLEMS = ["fails with a timeout error", "was charged twice", "has not arrived yet", "crashes on start",
            "is locked after three attempts", "never sends the email", "drops the connection every hour",
            "renewed without asking me", "is still pending after two weeks", "shows a blank screen",
            "cannot find the device", "has the wrong totals", "prints an empty page", "was rejected",
            "returns 403 for every call", "stopped at 40 percent"]
FILLERS = ["I already restarted everything.", "This is the third time I am writing.", "No rush, whenever you have time.",
           "Please call me back today.", "My colleague has the same problem.", "I attached a screenshot.",
           "We have a deadline on Friday.", "Thanks for your help so far.", "I am really disappointed.",
           "The order number is in the subject.", "It worked fine last month.", "Can someone look into it?",
           "I tried the steps from your FAQ but nothing changed.", "Our whole team is blocked by this.",
           "If this is not fixed I will cancel.", "Great service otherwise, just this one thing."]
NOUL = [("Is the customer unhappy?", None), ("Is this a refund request?",
                                             {"true": "the customer wants money back", "false": "no refund is requested"}),
        ("Does the customer ask for a call back?", None), ("Is this about a delivery problem?", None),
        ("Is the message urgent?", {"true": "needs an answer today"}), ("Is the tone friendly?", None)]
CHOICE = [("Which team should handle this?", ["billing", "technical support", "shipping", "sales"]),
          ("What is the main topic?", {"account": "login, password, profile", "payment": "charges, invoices, refunds",
                                       "product": "a device or app not working"}),
          ("Which channel should we reply on?", ["email", "phone"]),
          ("What does the customer want?", ["information", "a fix", "money back", "to cancel", "to complain", "nothing"])]
SCORE = [("How urgent is this?", ["not urgent", "soon", "today", "immediately"]),
         ("How angry is the customer?", ["calm", "annoyed", "angry"]),
         ("How complete is the problem description?", ["nothing useful", "vague", "some details", "enough to act",
                                                       "everything we need"])]


def sentence(rng):
    return f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(PROBLEMS)}."


def text(rng, words):
    parts = [sentence(rng)]
    while sum(len(p.split()) for p in parts) < words:
        parts.append(rng.choice(FILLERS) if rng.random() < 0.6 else sentence(rng))
    return " ".join(parts)


def state(rng):
    # a small-vocabulary tokenizer needs ~2 tokens a word: most states short enough for the 128 graph
    r = rng.random()
    words = rng.randint(3, 25) if r < 0.5 else rng.randint(25, 70) if r < 0.8 else rng.randint(70, 200)
    kind = rng.random()
    if kind < 0.5:
        return text(rng, words)
    if kind < 0.8:
        return {"subject": sentence(rng), "body": text(rng, words), "customer": rng.choice(["new", "returning", "vip"])}
    turns = max(1, words // 30)
    return [{"role": rng.choice(["customer", "agent"]), "text": text(rng, words // turns)} for _ in range(turns)]


def questions(rng):
    qs = {}
    for n in range(rng.randint(1, 3)):
        t = rng.choice(["noul", "noul", "choice", "score"])
        if t == "noul":
            ins, crit = rng.choice(NOUL)
            q = {"type": "noul", "instructions": ins}
            if crit:
                q["criteria"] = crit
        elif t == "choice":
            ins, crit = rng.choice(CHOICE)
            q = {"type": "choice", "instructions": ins, "criteria": crit}
        else:
            ins, crit = rng.choice(SCORE)
            q = {"type": "score", "instructions": ins, "criteria": crit}
        qs[f"q{n}"] = q
    return qs


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--n", type=int, default=240)
    g.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("split")
    s.add_argument("--requests", required=True)
    s.add_argument("--cal", required=True)
    s.add_argument("--heldout", required=True)
    s.add_argument("--every", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "generate":
        rng = random.Random(a.seed)
        with open(a.out, "w", encoding="utf-8") as f:
            for i in range(a.n):
                f.write(json.dumps({"id": f"gen-{i}", "state": state(rng), "questions": questions(rng)}) + "\n")
        return
    with open(a.requests, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    reqs = [line.get("request", line) for line in lines]
    for i, r in enumerate(reqs):
        r.setdefault("id", f"request-{i}")
    with open(a.cal, "w", encoding="utf-8") as c, open(a.heldout, "w", encoding="utf-8") as h:
        for i, r in enumerate(reqs):
            (h if i % a.every == a.every - 1 else c).write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(reqs)} requests: {sum(1 for i in range(len(reqs)) if i % a.every == a.every - 1)} held out")


if __name__ == "__main__":
    main()
