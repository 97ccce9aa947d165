"""Synthetic support tickets and the laya questions asked about them, with the generator's labels.

A ticket is drawn from latent facts (topic, whether a refund is wanted, urgency 0-4, sentiment
0-4) and rendered from templates as plain text, a JSON record or a short conversation. Questions
about it are drawn from several phrasings of each kind, and every question's answer follows from
the latent facts alone:

- noul: is it about <topic>? / does the customer want a refund? / is it urgent? / is the customer
  unhappy / happy?
- choice: which department (2-6 of them, in random order, labels with or without descriptions);
  the customer's tone (negative / neutral / positive).
- score: urgency and sentiment on 3 or 5 levels (the latent 0-4 value mapped onto the levels).

`request(rng)` returns one laya request and `labels` for it: for noul `true`/`false`, for choice the
label of the right option, for score the index of the right level.
"""
import json
import random

# topic -> (department labels, description keywords, noul phrasings, problem sentences)
TOPICS = {
    "billing": dict(
        labels=["billing", "payments", "finance", "accounting"],
        desc=["payments", "invoices", "refunds", "charges", "fees", "billing errors", "subscription fees",
              "double charges"],
        about=["billing", "payments", "a billing problem", "a charge or an invoice", "money", "an invoice",
               "a payment issue"],
        say=["I was charged twice for my order", "my invoice shows the wrong amount",
             "the payment went through twice", "there is an extra fee on my bill that I did not agree to",
             "I need a copy of my last invoice", "my card was charged after I cancelled",
             "the price on my invoice is higher than the one on your website",
             "you billed me for a plan I never ordered", "my payment was declined but the money is gone",
             "I paid the invoice but it still shows as unpaid", "the monthly charge doubled this month",
             "I was billed for two licenses instead of one"],
    ),
    "technical": dict(
        labels=["technical", "tech support", "engineering", "IT"],
        desc=["bugs", "crashes", "error messages", "login problems", "outages", "the app not working",
              "technical issues", "broken features"],
        about=["a technical problem", "a bug", "technical support", "a crash", "something broken in the app",
               "a software error"],
        say=["the app crashes when I log in", "I get an error 500 on the dashboard",
             "the page keeps loading forever", "the sync feature stopped working after the update",
             "I cannot log in, it says my password is wrong although it is not",
             "the mobile app freezes on the start screen", "exporting a report gives a blank file",
             "the website shows a white screen", "notifications are not working since yesterday",
             "the upload fails with a timeout error", "the app crashes every time I open settings",
             "two factor login codes never arrive"],
    ),
    "shipping": dict(
        labels=["shipping", "logistics", "delivery", "fulfilment"],
        desc=["deliveries", "tracking", "lost parcels", "damaged packages", "shipping addresses", "returns",
              "late orders"],
        about=["shipping", "a delivery", "a parcel", "an order that has not arrived", "a delivery problem"],
        say=["my order has not arrived yet", "the parcel arrived damaged", "the tracking number does not work",
             "the package was delivered to the wrong address", "my order is two weeks late",
             "the box was empty when it arrived", "the courier says the parcel was lost",
             "I received the wrong item in my package", "the delivery date keeps changing",
             "half of my order is missing from the package"],
    ),
    "sales": dict(
        labels=["sales", "pre-sales", "commercial", "business development"],
        desc=["pricing", "upgrades", "quotes", "new plans", "discounts", "enterprise offers", "buying licenses"],
        about=["pricing", "buying something", "an upgrade", "a sales question", "a quote"],
        say=["I would like a quote for 50 licenses", "what does the enterprise plan cost",
             "can I upgrade to the premium plan", "do you offer discounts for non-profits",
             "I want to buy more seats for my team", "is there a yearly plan that is cheaper",
             "we are interested in your product for our company", "can you send me your price list",
             "I want to move to the business plan", "do you have a volume discount"],
    ),
    "account": dict(
        labels=["account", "customer accounts", "account management", "profile"],
        desc=["profile changes", "email addresses", "closing accounts", "user names", "personal data",
              "account settings"],
        about=["account settings", "changing account details", "the customer's profile", "closing an account"],
        say=["I want to change the email address on my account", "please delete my account",
             "how do I change my user name", "I want to close my account", "please update my phone number",
             "I want to download all my personal data", "please change the name on my profile",
             "I want to merge my two accounts", "how can I change my company name in the account"],
    ),
    "feedback": dict(
        labels=["feedback", "product team", "customer success", "suggestions"],
        desc=["feature ideas", "suggestions", "compliments", "product feedback", "general comments"],
        about=["feedback", "a suggestion", "a feature idea", "product feedback"],
        say=["it would be great to have a dark mode", "I have an idea for a new feature",
             "the new dashboard looks really good", "please add an export to spreadsheet",
             "I wanted to share some thoughts about your product", "a calendar view would help me a lot",
             "your onboarding guide was very clear", "could you add keyboard shortcuts"],
    ),
}
TOPIC_NAMES = list(TOPICS)

REFUND_SAY = ["please refund me", "I want my money back", "I would like a refund",
              "please give me a refund", "can I get a refund", "I expect a full refund",
              "refund the amount please", "I want to return it and get my money back"]
REFUND_TOPICS = ["billing", "shipping", "billing", "shipping", "technical", "sales"]

URGENCY_SAY = {
    0: ["No rush, whenever you have time.", "This is not urgent at all.", "Take your time.",
        "Just for your information, no hurry."],
    1: ["It is not a big deal.", "It can wait a few days.", "When you get a chance."],
    2: ["Could you look into it this week?", "Please have a look when possible.", ""],
    3: ["Please fix this soon, it is blocking my work.", "I need this today.",
        "Please answer quickly, we need it by tomorrow.", "This is urgent."],
    4: ["URGENT: our whole team cannot work right now!", "This is critical, production is down!",
        "Emergency, we are losing customers every minute!", "I need this fixed immediately, it is an emergency!"],
}
SENTIMENT_SAY = {
    0: ["This is unacceptable!", "I am furious.", "Worst service ever.", "I am absolutely fed up with you.",
        "This is a disgrace."],
    1: ["I am quite disappointed.", "This is frustrating.", "I am not happy about this.",
        "Honestly this is annoying."],
    2: ["", "", "Thanks."],
    3: ["Thanks for your help.", "I appreciate your support.", "Thank you, you are usually great.",
        "Thanks a lot in advance."],
    4: ["I love your product!", "Your team is amazing, thank you so much!", "You are the best, keep it up!",
        "Fantastic service as always, thanks!"],
}
GREET = ["", "Hello,", "Hi,", "Hi team,", "Dear support,", "Good morning,", "Hey,"]
AGENT_SAY = ["Could you tell me more?", "Which version are you using?", "Can you share your order number?",
             "Thanks for reaching out, what happened exactly?", "I am sorry to hear that. Any details?",
             "When did this start?", "Let me check. What is your account email?"]
USER_MORE = ["It is order 48213.", "Version 2.3.1 on Android.", "Since Monday.", "My email is sam@example.com.",
             "It happened again this morning.", "Order number 7731.", "On the web and on my phone."]
NAMES = ["Sam", "Alex", "Maria", "Jonas", "Priya", "Chen", "Fatima", "Lukas", "Emma", "Omar"]

DEPT_QUESTIONS = ["Which department should handle this?", "Route this ticket to a team.",
                  "Which team is responsible?", "Who should answer this ticket?", "Pick the department.",
                  "Which queue does this ticket belong in?"]
NOUL_TOPIC = ["Is this about {x}?", "Is the customer asking about {x}?", "Does this ticket concern {x}?",
              "Is this ticket about {x}?", "Is the message about {x}?"]
NOUL_REFUND = ["Is the customer asking for a refund?", "Does the customer want their money back?",
               "Is this a refund request?", "Does the customer ask to be refunded?"]
NOUL_URGENT = ["Is this urgent?", "Does this need immediate attention?", "Is this an emergency?",
               "Should this be handled right away?"]
NOUL_UNHAPPY = ["Is the customer unhappy?", "Is the customer angry or upset?", "Is the customer dissatisfied?"]
NOUL_HAPPY = ["Is the customer happy?", "Is the customer satisfied?", "Is the tone friendly?"]
URGENCY_Q = ["How urgent is this?", "Rate the urgency.", "How quickly must we respond?", "Urgency of the ticket?"]
URGENCY_LEVELS = {
    5: [["not urgent", "low", "medium", "high", "critical"], ["none", "low", "moderate", "high", "emergency"],
        ["can wait", "low priority", "normal", "high priority", "immediately"]],
    3: [["low", "medium", "high"], ["not urgent", "normal", "urgent"]],
}
SENTIMENT_Q = ["How does the customer feel?", "Rate the customer's sentiment.", "What is the customer's mood?",
               "Sentiment of the message?"]
SENTIMENT_LEVELS = {
    5: [["very negative", "negative", "neutral", "positive", "very positive"],
        ["furious", "unhappy", "neutral", "satisfied", "delighted"]],
    3: [["negative", "neutral", "positive"], ["unhappy", "neutral", "happy"]],
}
TONE_Q = ["What is the tone of the message?", "Classify the customer's tone.", "Is the message positive or negative?"]
TONE_OPTS = [{"negative": None, "neutral": None, "positive": None},
             {"negative": "angry, disappointed or frustrated", "neutral": "matter of fact",
              "positive": "friendly, grateful or happy"},
             {"upset": None, "calm": None, "happy": None}]


def ticket(rng):
    """Latent facts of one ticket."""
    topic = rng.choice(TOPIC_NAMES)
    refund = topic in REFUND_TOPICS and rng.random() < 0.45
    urgency = rng.randint(0, 4)
    sentiment = rng.choice([0, 1, 2, 2, 3, 4]) if topic != "feedback" else rng.choice([2, 3, 3, 4, 4, 1])
    return {"topic": topic, "refund": refund, "urgency": urgency, "sentiment": sentiment}


def sentences(rng, t):
    """The ticket's content as a list of sentences (greeting and signature aside)."""
    core = [cap(rng.choice(TOPICS[t["topic"]]["say"])) + rng.choice([".", ".", "!"])]
    if rng.random() < 0.3:
        other = [s for s in TOPICS[t["topic"]]["say"] if s.lower() != core[0].lower()[:len(s)]]
        core.append(cap(rng.choice(other)) + ".")
    if t["refund"]:
        core.insert(rng.randint(0, len(core)), cap(rng.choice(REFUND_SAY)) + ".")
    extra = [s for s in (rng.choice(URGENCY_SAY[t["urgency"]]), rng.choice(SENTIMENT_SAY[t["sentiment"]])) if s]
    rng.shuffle(extra)
    return core + extra


def cap(s):
    return s[:1].upper() + s[1:]


def state(rng, t):
    body = sentences(rng, t)
    kind = rng.choices(["text", "json", "chat"], [5, 3, 3])[0]
    if kind == "text":
        head = rng.choice(GREET)
        tail = rng.choice(["", "", rng.choice(NAMES)])
        return " ".join(x for x in [head] + body + [tail] if x)
    if kind == "json":
        text = " ".join(body)
        form = rng.randint(0, 3)
        if form == 0:
            return {"subject": body[0], "body": " ".join(body[1:]) or body[0], "from": rng.choice(NAMES).lower() + "@example.com"}
        if form == 1:
            return {"ticket": rng.randint(1000, 99999), "channel": rng.choice(["email", "chat", "phone", "web"]),
                    "message": text}
        if form == 2:
            return {"customer": {"name": rng.choice(NAMES), "plan": rng.choice(["free", "pro", "business"])},
                    "text": text}
        return {"id": "T-%d" % rng.randint(100, 9999), "subject": rng.choice(["Help", "Problem", "Question", "Request", body[0]]),
                "body": text, "lang": "en"}
    user = rng.choice(["user", "customer"])
    agent = rng.choice(["agent", "assistant"])
    turns = [{"role": user, "content": " ".join(x for x in [rng.choice(GREET), body[0]] if x)}]
    rest = body[1:]
    while rest or len(turns) < 3:
        turns.append({"role": agent, "content": rng.choice(AGENT_SAY)})
        if rest:
            n = rng.randint(1, len(rest))
            turns.append({"role": user, "content": " ".join(rest[:n])})
            rest = rest[n:]
        else:
            turns.append({"role": user, "content": rng.choice(USER_MORE)})
    return turns


def level(value, k):
    """The latent 0-4 value on a scale of k levels."""
    return int(round(value * (k - 1) / 4.0))


def question(rng, t, kind):
    """One question of `kind` and its label."""
    if kind == "noul_topic":
        target = t["topic"] if rng.random() < 0.5 else rng.choice([x for x in TOPIC_NAMES if x != t["topic"]])
        q = {"type": "noul", "instructions": rng.choice(NOUL_TOPIC).format(x=rng.choice(TOPICS[target]["about"]))}
        return q, target == t["topic"]
    if kind == "noul_refund":
        q = {"type": "noul", "instructions": rng.choice(NOUL_REFUND)}
        if rng.random() < 0.2:
            q["criteria"] = {"true": "the customer wants money back", "false": "no refund is requested"}
        return q, t["refund"]
    if kind == "noul_urgent":
        return {"type": "noul", "instructions": rng.choice(NOUL_URGENT)}, t["urgency"] >= 3
    if kind == "noul_mood":
        if rng.random() < 0.5:
            return {"type": "noul", "instructions": rng.choice(NOUL_UNHAPPY)}, t["sentiment"] <= 1
        return {"type": "noul", "instructions": rng.choice(NOUL_HAPPY)}, t["sentiment"] >= 3
    if kind == "choice_dept":
        n = rng.randint(2, 6)
        picked = [t["topic"]] + rng.sample([x for x in TOPIC_NAMES if x != t["topic"]], n - 1)
        rng.shuffle(picked)
        # one naming scheme per question, so the labels read like one set of teams
        scheme = rng.randint(0, 3)
        labels = {x: TOPICS[x]["labels"][scheme] if rng.random() < 0.8 else rng.choice(TOPICS[x]["labels"])
                  for x in picked}
        if len(set(labels.values())) < len(labels):
            labels = {x: TOPICS[x]["labels"][0] for x in picked}
        form = rng.randint(0, 2)
        if form == 0:
            crit = [labels[x] for x in picked]
        elif form == 1:
            crit = {labels[x]: None for x in picked}
        else:
            crit = {labels[x]: ", ".join(rng.sample(TOPICS[x]["desc"], rng.randint(1, 3))) for x in picked}
        q = {"type": "choice", "instructions": rng.choice(DEPT_QUESTIONS), "criteria": crit}
        return q, labels[t["topic"]]
    if kind == "choice_tone":
        opts = rng.choice(TONE_OPTS)
        keys = list(opts)
        idx = 0 if t["sentiment"] <= 1 else 1 if t["sentiment"] == 2 else 2
        crit = dict(opts) if any(v is not None for v in opts.values()) or rng.random() < 0.5 else keys
        return {"type": "choice", "instructions": rng.choice(TONE_Q), "criteria": crit}, keys[idx]
    if kind == "score_urgency":
        k = rng.choice([3, 5, 5])
        crit = rng.choice(URGENCY_LEVELS[k])
        return {"type": "score", "instructions": rng.choice(URGENCY_Q), "criteria": list(crit)}, level(t["urgency"], k)
    if kind == "score_sentiment":
        k = rng.choice([3, 5, 5])
        crit = rng.choice(SENTIMENT_LEVELS[k])
        return ({"type": "score", "instructions": rng.choice(SENTIMENT_Q), "criteria": list(crit)},
                level(t["sentiment"], k))
    raise ValueError(kind)


KINDS = ["noul_topic", "noul_topic", "noul_refund", "noul_urgent", "noul_mood", "choice_dept", "choice_dept",
         "choice_tone", "score_urgency", "score_sentiment"]
QIDS = {"noul_topic": ["about", "topic", "is_about"], "noul_refund": ["refund", "wants_refund"],
        "noul_urgent": ["urgent", "asap"], "noul_mood": ["mood", "unhappy"],
        "choice_dept": ["dept", "department", "route", "team"], "choice_tone": ["tone"],
        "score_urgency": ["urgency", "priority"], "score_sentiment": ["sentiment", "feeling"]}


def request(rng, rid=None, n_questions=None, kinds=None):
    """One request (laya's JSON shape) and the generator's label for each question.

    `kinds` restricts the questions to those kinds (a training curriculum); by default all of them."""
    t = ticket(rng)
    pool = KINDS if kinds is None else [k for k in KINDS if k in kinds]
    n = min(n_questions or rng.choice([1, 2, 3, 3, 4]), len(pool))
    kinds = rng.sample(pool, n)
    questions, labels = {}, {}
    for kind in kinds:
        qid = rng.choice(QIDS[kind])
        while qid in questions:
            qid += "_2"
        q, label = question(rng, t, kind)
        questions[qid] = q
        labels[qid] = label
    req = {"state": state(rng, t), "questions": questions}
    if rid is not None:
        req = {"id": rid, **req}
    return req, labels, t


if __name__ == "__main__":
    r = random.Random(1)
    for i in range(5):
        req, labels, t = request(r, "x-%d" % i)
        print(json.dumps(req, ensure_ascii=False))
        print("  ", t, labels)
