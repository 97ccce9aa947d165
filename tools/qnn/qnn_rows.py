"""Row selection and mask construction shared by export_encoder.py and build_context.py.

numpy only (imported from both venvs: /work/venv with torch, /work/qnn-venv with onnxruntime-qnn).
"""
import json
import os

import numpy as np

MODELS = ("bpe-t5", "wp-t4", "bpe-small")
LENGTHS = (128, 256)
FIXTURES = "tests/fixtures/laya-0.3.20"
NEG = float(np.finfo(np.float32).min)  # torch.finfo(torch.float32).min, the additive "may not attend" bias

N_REF = 4  # rows per (model, L) saved as reference inputs/outputs; never used for calibration
N_EVAL = 16  # held-out rows (refs included) used for the fidelity numbers
N_CAL = 48  # calibration rows


def load_rows(repo, model):
    """All distinct recorded token layouts of `model` in cases.jsonl, in file order: [(case_id, qid, ids)]."""
    rows, seen = [], set()
    with open(os.path.join(repo, FIXTURES, "cases.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["model"] != model:
                continue
            for qid, v in (r.get("layout") or {}).items():
                ids = v.get("input_ids") if isinstance(v, dict) else None
                if not ids:
                    continue
                key = tuple(ids)
                if key in seen:
                    continue
                seen.add(key)
                rows.append((r["id"], qid, list(ids)))
    return rows


def split_rows(rows, L, n_eval=N_EVAL, n_cal=N_CAL):
    """Deterministic split of the rows that fit in L into (ref, eval, cal).

    ref  = N_REF rows spread over the length range (shortest, ~1/3, ~2/3, longest that fits);
           for L=256 the upper ones are longer than 128 so they exercise the longer graph.
    eval = ref + further held-out rows (every 4th of the rest) up to N_EVAL.
    cal  = the remaining rows, evenly strided down to N_CAL, never overlapping eval.
    """
    fit = [r for r in rows if len(r[2]) <= L]
    order = sorted(range(len(fit)), key=lambda i: (len(fit[i][2]), i))
    if L > 128:  # make the L=256 refs mostly long rows
        long_ = [i for i in order if len(fit[i][2]) > 128]
        picks = [order[0]] + [long_[int(k * (len(long_) - 1) / (N_REF - 2))] for k in range(N_REF - 1)] if len(long_) >= N_REF - 1 else None
    else:
        picks = None
    if picks is None:
        picks = [order[int(k * (len(order) - 1) / (N_REF - 1))] for k in range(N_REF)]
    ref = []
    for i in picks:
        if i not in ref:
            ref.append(i)
    rest = [i for i in range(len(fit)) if i not in ref]
    ev = list(ref) + rest[::4][: n_eval - len(ref)]
    cal_pool = [i for i in rest if i not in ev]
    stride = max(1, len(cal_pool) // n_cal) if n_cal else 1
    cal = cal_pool[::stride][:n_cal]
    return [fit[i] for i in ref], [fit[i] for i in ev], [fit[i] for i in cal]


def spread(xs, n):
    """Up to n items of xs, evenly strided."""
    if len(xs) <= n:
        return list(xs)
    return [xs[int(k * len(xs) / n)] for k in range(n)]


def split_heldout(cal_rows, held_rows, L, n_eval=N_EVAL, n_cal=N_CAL):
    """(ref, eval, cal) when the held-out rows come from separate requests: ref and eval from
    `held_rows` (ref chosen as in split_rows, eval = ref + the rest evenly strided, for L > 128 the
    rows longer than 128 first), cal from
    `cal_rows`, each restricted to the rows that fit in L."""
    ref, _, _ = split_rows(held_rows, L, n_eval=N_REF, n_cal=0)
    keys = {tuple(r[2]) for r in ref}
    rest = [r for r in held_rows if len(r[2]) <= L and tuple(r[2]) not in keys]
    # a graph above 128 tokens only answers rows longer than 128 (the agent takes the smallest graph
    # that holds a row): evaluate it on those first, and on shorter rows only to fill up
    long_ = [r for r in rest if L <= 128 or len(r[2]) > 128]
    short = [r for r in rest if not (L <= 128 or len(r[2]) > 128)]
    n_long = min(len(long_), n_eval - len(ref))
    ev = list(ref) + spread(long_, n_long) + spread(short, n_eval - len(ref) - n_long)
    cal = spread([r for r in cal_rows if len(r[2]) <= L], n_cal)
    return ref, ev, cal


def masks(n, L, local_attention):
    """Additive attention biases (1,1,L,L) float32 for a row of n real tokens padded to L.

    gmask: 0 where key j < n, NEG where j >= n (padding key).
    smask: gmask plus NEG where |i - j| > local_attention // 2 (transformers' bidirectional sliding window).
    """
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    keyok = np.broadcast_to(j < n, (L, L))
    g = np.where(keyok, 0.0, NEG).astype(np.float32)
    s = np.where(keyok & (np.abs(i - j) <= local_attention // 2), 0.0, NEG).astype(np.float32)
    return g[None, None], s[None, None]


def embeds(table, ids, pad_id, L):
    """(1, L, d) float32: tok_embeddings rows for ids, padded with the pad token's row."""
    full = list(ids) + [pad_id] * (L - len(ids))
    return np.asarray(table, dtype=np.float32)[np.asarray(full)][None].copy()
