#!/usr/bin/env python3
"""Decisions of the float model against the QNN binaries on held-out rows: the fidelity report.

Runs in the export venv (torch + laya 0.3.20), after build_context.py has run every binary on the HTP
simulator over the `eval` rows of <build>/<name>/rows_L<L>.npz (rows never used for calibration) and
saved the hidden states as <build>/<name>/sim_<graph>_eval_hidden.npy:

    /work/venv-demo/bin/python tools/qnn/fidelity_report.py --build tools/qnn/build --name demo \\
        --checkpoint models/demo --requests tests/fixtures/demo/heldout.jsonl --skip-requests 100

For each row the float answer is laya's own forward pass (`DecisionModel.forward` on the input ids);
the NPU answer is the same decision head (`type_emb`, head layers, marker gather, scorer) applied to the
simulator's final-LayerNorm hidden states, exactly what the agent's host does with the NPU's output.
Answer probabilities are softmax(logits / T) with laya's temperature for the question's type and option
count (`Agent._decode_answers`). Figures per binary:

  argmax agreement       rows whose most probable option is the same
  clear agreement        the same, over rows whose float top-two probabilities are more than 0.02 apart
  mean / max |dp|        over every option of every row
  mean logit cosine      cosine of the row's option logits (float vs NPU), averaged over rows
  collapse indicators    rows the NPU answers near-uniformly (top-two within 0.02) while the float
                         model does not; distinct NPU outputs (rounded to 1e-3) over distinct float ones

and writes them to <build>/<name>/fidelity_report.json (and --json if given).
"""
import argparse
import glob
import json
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_encoder import request_items  # noqa: E402

CLEAR = 0.02


@torch.no_grad()
def head_logits(model, h, markers, qtype):
    """laya 0.3.20's DecisionModel.forward after the encoder, on one row's real positions h (n, d)."""
    h = torch.as_tensor(h, dtype=torch.float32)[None]
    h = h + model.type_emb(torch.tensor([qtype]))[:, None, :]
    if model.head is not None:
        pad = torch.zeros(h.shape[:2], dtype=torch.bool)
        for layer in model.head.layers:
            h = layer(h, src_key_padding_mask=pad)
    idx = torch.tensor(markers)[None, :, None].expand(-1, -1, h.size(-1))
    return model.scorer(torch.gather(h, 1, idx)).squeeze(-1).float()[0].numpy()


@torch.no_grad()
def float_logits(model, ids, markers, qtype):
    """laya's own forward pass on one row (no padding)."""
    n, k = len(ids), len(markers)
    logits, _ = model(torch.tensor([ids]), torch.ones((1, n), dtype=torch.long), torch.tensor([markers]),
                      torch.ones((1, k), dtype=torch.bool), torch.tensor([qtype]))
    return logits[0].float().numpy()


def probs(agent, logits, qtype):
    from laya.common import temp_bucket
    k = len(logits)
    t = agent.temperature_by_options.get(temp_bucket(qtype, k), agent.temperature[qtype])
    z = logits / t
    p = np.exp(z - z.max())
    return p / p.sum()


def top2_margin(p):
    s = np.sort(p)[::-1]
    return float(s[0] - s[1]) if len(s) > 1 else 1.0


def report(agent, rows, sim):
    """rows: [(ids, markers, qtype)], sim: (N, L, d) simulator hidden states of the same rows."""
    model = agent.model
    agree = clear = clear_agree = uniform_npu = 0
    dps, cos, fouts, nouts = [], [], set(), set()
    for (ids, markers, qt), h in zip(rows, sim):
        lf = float_logits(model, ids, markers, qt)
        ln = head_logits(model, h[: len(ids)], markers, qt)
        pf, pn = probs(agent, lf, qt), probs(agent, ln, qt)
        same = int(pf.argmax() == pn.argmax())
        agree += same
        if top2_margin(pf) > CLEAR:
            clear += 1
            clear_agree += same
            uniform_npu += int(top2_margin(pn) <= CLEAR)
        dps.extend(np.abs(pf - pn).tolist())
        cos.append(float(np.dot(lf, ln) / (np.linalg.norm(lf) * np.linalg.norm(ln) + 1e-12)))
        fouts.add(tuple(np.round(pf, 3)))
        nouts.add(tuple(np.round(pn, 3)))
    n = len(rows)
    return {
        "rows": n,
        "rows_longer_than_128": sum(1 for ids, _, _ in rows if len(ids) > 128),
        "argmax_agree": agree,
        "argmax_agreement": agree / n,
        "clear_rows": clear,
        "clear_agree": clear_agree,
        "clear_agreement": clear_agree / clear if clear else None,
        "clear_flipped_pct": 100.0 * (clear - clear_agree) / clear if clear else None,
        "mean_abs_dp": float(np.mean(dps)),
        "max_abs_dp": float(np.max(dps)),
        "mean_logit_cosine": float(np.mean(cos)),
        "min_logit_cosine": float(np.min(cos)),
        "clear_rows_npu_near_uniform": uniform_npu,
        "distinct_outputs_npu_vs_float": [len(nouts), len(fouts)],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--requests", required=True, help="the requests file export_encoder.py laid the rows out from")
    ap.add_argument("--skip-requests", type=int, default=0)
    ap.add_argument("--graphs", nargs="*", help="graph names (enc_L128_f32io ...); default: every sim_*_eval_hidden.npy")
    ap.add_argument("--json", help="also write the report here")
    a = ap.parse_args()
    import laya
    agent = laya.Agent(os.path.abspath(a.checkpoint), device="cpu")
    agent.model.float().eval()
    by_ids = {tuple(ids): (markers, qt) for _, _, ids, markers, qt in
              request_items(agent, os.path.abspath(a.requests), a.skip_requests)}
    bdir = os.path.join(a.build, a.name)
    names = a.graphs or sorted(re.match(r"sim_(.*)_eval_hidden\.npy", os.path.basename(p)).group(1)
                               for p in glob.glob(os.path.join(bdir, "sim_*_eval_hidden.npy")))
    out = {"checkpoint": a.checkpoint, "requests": a.requests, "skip_requests": a.skip_requests,
           "clear_margin": CLEAR, "graphs": {}}
    cache = {}
    print(f"{'graph':<34} {'rows':>4} {'>128':>4} {'argmax':>9} {'clear':>9} {'flipped':>8} {'mean|dp|':>9} {'max|dp|':>8} "
          f"{'cosine':>8} {'uniform':>7} {'distinct':>9}")
    for name in names:
        L = int(re.match(r"enc_L(\d+)_", name).group(1))
        if L not in cache:
            z = np.load(os.path.join(bdir, f"rows_L{L}.npz"))
            rows = []
            for ids, n in zip(z["eval_ids"], z["eval_lens"]):
                ids = [int(t) for t in ids[:n]]
                markers, qt = by_ids[tuple(ids)]
                rows.append((ids, markers, qt))
            cache[L] = rows
            # the host-side head on PyTorch's own hidden states must reproduce laya's forward pass
            chk = max(float(np.abs(head_logits(agent.model, h[: len(ids)], m, qt) - float_logits(agent.model, ids, m, qt)).max())
                      for (ids, m, qt), h in zip(rows, z["eval_hidden"]))
            out.setdefault("check_head_on_torch_hidden_max_abs_logit", {})[L] = chk
            assert chk < 1e-3, f"the head on PyTorch's hidden states differs from laya's forward by {chk}"
        sim = np.load(os.path.join(bdir, f"sim_{name}_eval_hidden.npy"))
        r = report(agent, cache[L], sim)
        out["graphs"][name] = r
        print(f"{name:<34} {r['rows']:>4} {r['rows_longer_than_128']:>4} {r['argmax_agree']:>4}/{r['rows']:<4} "
              f"{r['clear_agree']:>4}/{r['clear_rows']:<4} {r['clear_flipped_pct'] or 0:>7.1f}% "
              f"{r['mean_abs_dp']:>9.4f} {r['max_abs_dp']:>8.3f} {r['mean_logit_cosine']:>8.4f} "
              f"{r['clear_rows_npu_near_uniform']:>7} {r['distinct_outputs_npu_vs_float'][0]:>4}/{r['distinct_outputs_npu_vs_float'][1]:<4}",
              flush=True)
    for path in filter(None, (os.path.join(bdir, "fidelity_report.json"), a.json)):
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
