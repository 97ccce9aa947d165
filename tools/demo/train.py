#!/usr/bin/env python3
"""Train the laya-edge demo model: a small laya 0.3.20 checkpoint that triages support tickets.

Usage:  python tools/demo/train.py --out models/demo

Everything is laya's own code except the training loop, which laya 0.3.20 does not ship: the model
is `laya.common.build_model(cfg, encoder_dir, pretrained=False)`, every question row is laid out by
`laya.common.build_sequence` after `Agent._check_question` / `Agent._to_internal` (exactly what
`Agent.predict` does), rows are batched by `laya.common.collate_items` with a one-hot `target`, and
the loss is the cross-entropy of that target against the marker logits (the model's masked `logits`
output), one term per question. The act head is left as `build_model` initialises it: no act
targets exist for this task. Temperatures (one per question type, laya's `temperature` list in
rl_agent_config.json, indexed by `laya.common.QTYPES`) are fitted on a held-out split by minimising
the negative log-likelihood over laya's allowed range [TEMP_MIN, TEMP_MAX].

Seeded and CPU only; `torch.set_num_threads(2)`.
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

SEED = 19
SPEC = dict(vocab=1600, hidden=64, layers=2, heads=4, intermediate=128, every_n=3, local_attention=128,
            global_theta=160000.0, local_theta=10000.0, bias=False, initializer_range=0.1)
RL = dict(encoder="answerdotai/ModernBERT-base", head_layers=1, max_len=256, head_max_len=160, act_costs={"ask": 0.1})


def arg_parser():
    ap = argparse.ArgumentParser()
    # No defaults that point at tracked files: the shipped model is rebuilt with
    # `--out models/demo --metrics tools/demo/metrics.json` said out loud (tools/demo/README.md).
    ap.add_argument("--out", required=True, help="the checkpoint directory to write (replaced if it exists)")
    ap.add_argument("--seed", type=int, default=SEED,
                    help="seed of the tokenizer corpus, the data, the initial weights and the order (%d made models/demo)" % SEED)
    ap.add_argument("--train-requests", type=int, default=6000)
    ap.add_argument("--val-requests", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--stop-at", type=int, default=0,
                    help="stop after this many steps of the --steps schedule (what a STOP file in --out did)")
    ap.add_argument("--aux-weight", type=float, default=0.5)
    ap.add_argument("--facts-weight", type=float, default=1.0)
    ap.add_argument("--no-question-probe", dest="question_probe", action="store_false")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; on the 2-core machine shared with Rust builds one thread ran a step "
                         "about 4x faster than two (the second thread mostly waited for the first)")
    ap.add_argument("--kinds", default="", help="comma-separated question kinds (tickets.KINDS); default all")
    ap.add_argument("--hidden", type=int, default=SPEC["hidden"])
    ap.add_argument("--layers", type=int, default=SPEC["layers"])
    ap.add_argument("--heads", type=int, default=SPEC["heads"])
    ap.add_argument("--intermediate", type=int, default=SPEC["intermediate"])
    ap.add_argument("--init-range", type=float, default=SPEC["initializer_range"])
    ap.add_argument("--metrics", default=None, help="where to write the training metrics (default: OUT/../metrics-<name>.json beside OUT)")
    return ap


# Parsed before the imports below, so a usage mistake (no --out) is said without torch and laya
# installed and before anything is written.
ARGS = arg_parser().parse_args() if __name__ == "__main__" else None

import numpy as np  # noqa: E402
import torch  # noqa: E402

import generate as fixtures  # noqa: E402  (the fixture generator's tokenizer and encoder-config code)
import laya  # noqa: E402
import laya.agent  # noqa: E402
import laya.common as lc  # noqa: E402
import tickets  # noqa: E402

torch.use_deterministic_algorithms(False)



def corpus(rng, n):
    """Text the tokenizer is trained on: states, question heads and option texts as laya renders them."""
    lines = []
    for _ in range(n):
        req, _, _ = tickets.request(rng)
        lines.append(lc.serialize_state(req["state"]))
        for q in req["questions"].values():
            iq = laya.agent.Agent._to_internal(q)
            lines.append("%s question: %s" % (iq["t"], iq["ins"]))
            lines.extend(" " + o for o in lc.render_options(iq))
    return lines


def encode(tok, req, labels, t=None):
    """laya's rows for one request (what Agent._encode_state builds), each with a one-hot target."""
    ids = list(req["questions"])
    for qid in ids:
        laya.agent.Agent._check_question(qid, req["questions"][qid])
    internal = {qid: laya.agent.Agent._to_internal(req["questions"][qid]) for qid in ids}
    state = req["state"]
    state_ids = tok(lc.serialize_state(state).replace(tok.mask_token, " "), add_special_tokens=False)["input_ids"]
    items = []
    for qid in ids:
        q = internal[qid]
        seq, markers = lc.build_sequence(tok, state, q, RL["max_len"], RL["head_max_len"],
                                         truncate_left=isinstance(state, list), state_ids=state_ids)
        k = len(lc.render_options(q))
        assert len(markers) == k, (qid, req)
        lab = labels[qid]
        if q["t"] == "noul":
            idx = 1 if lab else 0
        elif q["t"] == "choice":
            idx = list(q["crit"].keys()).index(lab)
        else:
            idx = lab
        target = [0.0] * k
        target[idx] = 1.0
        item = {"ids": seq, "markers": markers, "qtype": lc.QTYPES[q["t"]], "target": target, "label": idx,
                "kind": qid}
        if t is not None:
            item["facts"] = [tickets.TOPIC_NAMES.index(t["topic"]), int(t["refund"]), t["urgency"], t["sentiment"]]
        items.append(item)
    return items


def dataset(tok, seed, n, kinds=None):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        req, labels, t = tickets.request(rng, kinds=kinds)
        rows.extend(encode(tok, req, labels, t))
    return rows


def batches(rows, size, rng):
    """Length-bucketed batches in random order (less padding, same rows every epoch)."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["ids"]), rng.random()))
    chunks = [order[i:i + size] for i in range(0, len(order), size)]
    rng.shuffle(chunks)
    return chunks


def loss_of(model, b):
    """laya's loss: cross-entropy of the one-hot target against the marker logits, per question."""
    logits, _ = model(b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"])
    logp = torch.log_softmax(logits, -1)
    return -(b["target"] * logp).sum(-1).mean(), logits


class MarkerProbe(torch.nn.Module):
    """Training aid, not saved: predicts, from the encoder's output at each option marker, the
    first `OFFSETS` tokens of that marker's option.

    laya's markers are [MASK] tokens and its encoder is a pretrained masked-language model, so a
    marker already "knows" the option text after it. A tiny encoder trained from scratch does not:
    every marker starts out identical, and on the laya loss alone the model sits at the uniform
    answer for hundreds of steps. This auxiliary loss (a small piece of masked-language modelling)
    teaches the markers to read their options first; the checkpoint is the same laya model.
    """

    OFFSETS = 3

    def __init__(self, d, vocab, special_ids, question=False):
        super().__init__()
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, vocab) for _ in range(self.OFFSETS))
        self.special = torch.tensor(sorted(special_ids))
        # with `question`, each marker also predicts the words of the question's instructions (a
        # bag of words): a noul marker's option text is always the same, its question is not
        self.question = torch.nn.Linear(d, vocab) if question else None

    def forward(self, h, b):
        ids, mpos, mmask = b["input_ids"], b["marker_pos"], b["marker_mask"]
        total, n = 0.0, 0
        for o, lin in enumerate(self.out, start=1):
            pos = (mpos + o).clamp(max=ids.size(1) - 1)
            tgt = torch.gather(ids, 1, pos)
            ok = mmask & (mpos + o < ids.size(1)) & ~torch.isin(tgt, self.special)
            if ok.any():
                hm = torch.gather(h, 1, mpos[:, :, None].expand(-1, -1, h.size(-1)))
                total = total + torch.nn.functional.cross_entropy(lin(hm[ok]), tgt[ok])
                n += 1
        if self.question is not None:
            # the instructions: between [CLS] and the [SEP] before the first marker
            bag = torch.zeros(ids.size(0), self.question.out_features)
            for i in range(ids.size(0)):
                head = ids[i, 1:max(2, int(mpos[i, 0]) - 1)]
                head = head[~torch.isin(head, self.special)]
                if len(head):
                    bag[i].index_add_(0, head, torch.ones(len(head)))
            bag = bag / bag.sum(-1, keepdim=True).clamp(min=1)
            hm = torch.gather(h, 1, mpos[:, :, None].expand(-1, -1, h.size(-1)))
            logp = torch.log_softmax(self.question(hm), -1)
            total = total - ((bag[:, None, :] * logp).sum(-1) * mmask).sum() / mmask.sum()
            n += 1
        return total / max(1, n)


class FactProbe(torch.nn.Module):
    """Training aid, not saved: predicts the ticket's latent facts (topic, refund, urgency,
    sentiment) from the encoder's output at every option marker.

    Every laya answer here is a function of these facts and of the question; a tiny encoder from
    scratch finds no gradient towards reading the state while its markers are still interchangeable.
    This loss makes each marker carry a summary of the state; the laya loss then only has to learn
    to match it against the option and the question.
    """

    SIZES = (6, 2, 5, 5)

    def __init__(self, d):
        super().__init__()
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, k) for k in self.SIZES)

    def forward(self, h, b, facts):
        mpos, mmask = b["marker_pos"], b["marker_mask"]
        hm = torch.gather(h, 1, mpos[:, :, None].expand(-1, -1, h.size(-1)))[mmask]
        f = facts[:, None, :].expand(-1, mpos.size(1), -1)[mmask]
        return sum(torch.nn.functional.cross_entropy(lin(hm), f[:, i]) for i, lin in enumerate(self.out)) / len(self.out)


@torch.no_grad()
def predict_logits(model, rows, pad_id, size=64):
    model.eval()
    out = []
    for i in range(0, len(rows), size):
        b = lc.collate_items([rows[i:i + size]], pad_id)
        logits, _ = model(b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"])
        out.extend(logits[j, :len(r["markers"])].numpy().astype(np.float64) for j, r in enumerate(rows[i:i + size]))
    return out


def nll(logits, rows, t):
    """Mean negative log-likelihood of the labels at temperature t (rows grouped by option count)."""
    total, n = 0.0, 0
    for k in sorted({len(z) for z in logits}):
        sel = [(z, r["label"]) for z, r in zip(logits, rows) if len(z) == k]
        z = np.stack([s[0] for s in sel]) / t
        lab = np.array([s[1] for s in sel])
        m = z.max(1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(z - m).sum(1)))
        total += float((lse - z[np.arange(len(sel)), lab]).sum())
        n += len(sel)
    return total / max(1, n)


def fit_temperatures(logits, rows):
    """One temperature per question type: the NLL minimum over laya's allowed range, 0.01 apart."""
    temps, report = [1.0, 1.0, 1.0], {}
    grid = [round(lc.TEMP_MIN + 0.01 * i, 2) for i in range(int(round((lc.TEMP_MAX - lc.TEMP_MIN) / 0.01)) + 1)]
    for name, qt in lc.QTYPES.items():
        sel = [(z, r) for z, r in zip(logits, rows) if r["qtype"] == qt]
        zs, rs = [z for z, _ in sel], [r for _, r in sel]
        best = min(grid, key=lambda t: nll(zs, rs, t))
        temps[qt] = best
        report[name] = {"rows": len(rs), "temperature": best, "nll_at_1": round(nll(zs, rs, 1.0), 4),
                        "nll_fitted": round(nll(zs, rs, best), 4)}
    return temps, report


def accuracy(logits, rows):
    by = {}
    for z, r in zip(logits, rows):
        kind = r["kind"]
        ok, n = by.get(kind, (0, 0))
        by[kind] = (ok + int(int(np.argmax(z)) == r["label"]), n + 1)
    total = sum(ok for ok, _ in by.values()) / max(1, sum(n for _, n in by.values()))
    return round(total, 4), {k: round(ok / n, 4) for k, (ok, n) in sorted(by.items())}


def main():
    args = ARGS
    if args.metrics is None:
        out_dir = os.path.abspath(args.out)
        args.metrics = os.path.join(os.path.dirname(out_dir), "metrics-%s.json" % os.path.basename(out_dir))
    seed = args.seed
    torch.set_num_threads(args.threads)
    started = time.time()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    out = args.out
    if os.path.exists(out):
        shutil.rmtree(out)
    tok_dir = os.path.join(out, "tokenizer")
    os.makedirs(tok_dir)
    tk = fixtures.train_bpe(corpus(random.Random(seed), 6000), SPEC["vocab"])
    fixtures.save_tokenizer(tk, tok_dir)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)

    enc_dir = os.path.join(out, "encoder")
    os.makedirs(enc_dir)
    SPEC.update(hidden=args.hidden, layers=args.layers, heads=args.heads, intermediate=args.intermediate,
                initializer_range=args.init_range)
    ecfg = fixtures.encoder_config(SPEC, tok)
    # ModernBERT's 0.02 suits a 768-wide pretrained encoder; a 64-wide one trained from scratch
    # sits on a plateau for hundreds of steps with it (attention starts out uniform, every option
    # marker looks the same), so the weights start wider.
    ecfg.initializer_range = SPEC["initializer_range"]
    ecfg.save_pretrained(enc_dir)
    with open(os.path.join(enc_dir, "config.json"), encoding="utf-8") as f:
        fixtures.write_json(os.path.join(enc_dir, "config.json"), json.load(f), indent=2)

    # train and validation requests come from different seeds; the committed test set from a third
    kinds = [k for k in args.kinds.split(",") if k] or None
    train_rows = dataset(tok, seed + 1, args.train_requests, kinds)
    val_rows = dataset(tok, seed + 2, args.val_requests, kinds)
    print("rows: train %d, val %d, longest %d tokens (%.0fs)" % (len(train_rows), len(val_rows),
                                                         max(len(r["ids"]) for r in train_rows), time.time() - started), file=sys.stderr)

    torch.manual_seed(seed)
    model = lc.build_model(RL, encoder_dir=enc_dir, pretrained=False)
    act_init = {k: v.clone() for k, v in model.act_head.state_dict().items()}
    captured = {}
    model.encoder.register_forward_hook(lambda mod, inp, out: captured.__setitem__("h", out.last_hidden_state))
    probe = MarkerProbe(SPEC["hidden"], len(tok), tok.all_special_ids, question=args.question_probe)
    fprobe = FactProbe(SPEC["hidden"])
    params = [p for n, p in model.named_parameters() if not n.startswith("act_head.")]
    opt = torch.optim.AdamW(params + list(probe.parameters()) + list(fprobe.parameters()), lr=args.lr,
                            weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    rng = random.Random(seed + 3)
    step, plan, running, running_aux, running_facts = 0, [], None, None, 0.0
    stop_at = args.stop_at or args.steps
    stop_file = os.path.join(out, "STOP")
    while step < stop_at:
        if os.path.exists(stop_file):  # a shared machine ran late: stop here, say so in the metrics
            os.remove(stop_file)
            break
        if not plan:
            plan = batches(train_rows, args.batch, rng)
        idx = plan.pop()
        b = lc.collate_items([[train_rows[i] for i in idx]], tok.pad_token_id)
        model.train()
        loss, _ = loss_of(model, b)
        aux = probe(captured["h"], b) if args.aux_weight else torch.zeros(())
        total = loss + args.aux_weight * aux
        if args.facts_weight:
            facts = torch.tensor([train_rows[i]["facts"] for i in idx])
            floss = fprobe(captured["h"], b, facts)
            total = total + args.facts_weight * floss
            running_facts = 0.95 * running_facts + 0.05 * floss.item()
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        running_aux = aux.item() if running_aux is None else 0.95 * running_aux + 0.05 * aux.item()
        if step % 20 == 0 or step == stop_at:
            print("step %d loss %.4f aux %.4f facts %.4f (%.0fs)" % (step, running, running_aux, running_facts,
                                                                     time.time() - started), file=sys.stderr)
    for k, v in model.act_head.state_dict().items():
        assert torch.equal(v, act_init[k]), "the act head must stay as build_model initialised it"

    val_logits = predict_logits(model, val_rows, tok.pad_token_id)
    acc, acc_by = accuracy(val_logits, val_rows)
    temps, temp_report = fit_temperatures(val_logits, val_rows)

    rl = dict(RL)
    rl["temperature"] = temps
    fixtures.write_json(os.path.join(out, "rl_agent_config.json"), rl, indent=2)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    from safetensors.torch import save_file
    save_file(sd, os.path.join(out, "model.safetensors"))

    metrics = {"seed": seed, "steps": args.steps, "steps_done": step, "batch": args.batch, "lr": args.lr, "aux_weight": args.aux_weight,
               "facts_weight": args.facts_weight, "question_probe": args.question_probe, "kinds": kinds or "all",
               "threads": args.threads, "encoder": {k: SPEC[k] for k in ("hidden", "layers", "heads", "intermediate",
                                                                          "initializer_range")},
               "train_requests": args.train_requests, "train_rows": len(train_rows), "val_rows": len(val_rows),
               "val_accuracy": acc, "val_accuracy_by_question": acc_by, "temperatures": temp_report,
               "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - started),
               "laya": laya.__version__, "torch": torch.__version__}
    fixtures.write_json(args.metrics, metrics, indent=2)
    print(json.dumps(metrics, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
