#!/usr/bin/env python3
"""Export the ModernBERT encoder of each fixture checkpoint as a static-shape ONNX model.

Runs in /work/venv (laya==0.3.20, transformers, torch, onnx):

    /work/venv/bin/python tools/qnn/export_encoder.py --build tools/qnn/build

For every model in tests/fixtures/laya-0.3.20/models and L in (128, 256) it writes

    <build>/<model>/encoder_L<L>.onnx   inputs  inputs_embeds (1,L,d) f32, gmask (1,1,L,L) f32, smask (1,1,L,L) f32
                                         output  hidden (1,L,d) f32 = ModernBertModel(...).last_hidden_state
    <build>/<model>/rows_L<L>.npz        the ref / eval / cal rows (embeddings, lengths, ids) and, for ref and
                                         eval rows, the float PyTorch encoder's hidden states
    <build>/<model>/export_L<L>.json     versions, row ids, and the ONNX-vs-PyTorch check

Any other checkpoint directory (an ordinary trained one, e.g. the demo model) is exported with
`--checkpoint DIR --name NAME --requests FILE`: its rows are laid out by laya's own
`Agent._encode_state` from the requests in FILE (one JSON object a line, the request itself or
{"request": ...}, as tests/fixtures/demo/heldout.jsonl), after skipping the first `--skip-requests`
(the ones the Rust tests answer, so calibration never sees them). Such a checkpoint is exported as
it is (never snapped onto the uint8 grid) and output goes to <build>/<NAME>.

    /work/venv-demo/bin/python tools/qnn/export_encoder.py --build tools/qnn/build --checkpoint models/demo \
        --name demo --requests tests/fixtures/demo/heldout.jsonl --skip-requests 100

and checks (a) eager attention with the explicit masks against laya's own encoder call (sdpa, 2-D
attention_mask) on the real tokens and (b) the ONNX model (onnxruntime CPU if importable, else
onnx.reference) against PyTorch on the eval rows.
"""
import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qnn_rows as R  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OPSET = 17


class EncoderWrap(torch.nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, inputs_embeds, gmask, smask):
        out = self.enc(inputs_embeds=inputs_embeds,
                       attention_mask={"full_attention": gmask, "sliding_attention": smask})
        return out.last_hidden_state


def show(path):
    """`path` relative to the repository when it is inside it (the fixtures' commands), else absolute."""
    path = os.path.abspath(path)
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def load_encoder(ckpt):
    import laya
    agent = laya.Agent(ckpt, device="cpu")
    enc = agent.model.encoder.float().eval()
    if hasattr(enc, "set_attn_implementation"):
        enc.set_attn_implementation("eager")
    else:
        enc.config._attn_implementation = "eager"
    assert enc.config._attn_implementation == "eager", enc.config._attn_implementation
    return agent, enc


def snap_u8(w):
    """`w` moved onto the uint8 grid onnxruntime's quantizer gives it (per tensor, asymmetric, the
    range widened to hold 0: scale = (max - min) / 255, zero point = round(-min / scale)), so the
    QDQ model's DequantizeLinear(uint8) reproduces it exactly."""
    rmin, rmax = min(0.0, float(w.min())), max(0.0, float(w.max()))
    scale = np.float32((rmax - rmin) / 255.0)
    zp = np.round(-rmin / scale)
    q = np.clip(np.round(w / scale) + zp, 0, 255)
    return ((q - zp) * scale).astype(np.float32)


def snap_encoder(enc):
    """Puts every encoder weight that becomes a uint8 QNN weight (Linear and LayerNorm weights; not
    the token embeddings, which the host gathers in float) on its uint8 grid. Returns the names."""
    names = []
    with torch.no_grad():
        for name, p in enc.named_parameters():
            # Biases become int32 (scale = input scale x weight scale): fine enough to leave as they are.
            if name == "embeddings.tok_embeddings.weight" or not name.endswith(".weight"):
                continue
            p.copy_(torch.from_numpy(snap_u8(p.detach().float().numpy())))
            names.append(name)
    return names


def write_checkpoint(model, enc, names, dest):
    """A copy of the fixture checkpoint with the snapped encoder weights (float32; every other tensor
    keeps its dtype, so an f16 checkpoint still has f16 token embeddings and head)."""
    import shutil
    from safetensors.numpy import load_file, save_file
    src = os.path.join(REPO, R.FIXTURES, "models", model)
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    params = dict(enc.named_parameters())
    for name in names:
        key = f"encoder.{name}"
        assert key in tensors, key
        tensors[key] = params[name].detach().float().numpy().copy()
    save_file(tensors, os.path.join(dest, "model.safetensors"))


def request_items(agent, path, skip):
    """[(request id, qid, input_ids, markers, qtype)] of the requests in `path` after the first `skip`,
    laid out by laya 0.3.20's own code (`Agent._check_question`, `Agent._to_internal`,
    `Agent._encode_state`), in file order."""
    import laya.agent
    out = []
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(l) for l in f if l.strip()]
    for n, line in enumerate(lines[skip:]):
        req = line.get("request", line)
        ids = list(req["questions"])
        for qid in ids:
            laya.agent.Agent._check_question(qid, req["questions"][qid])
        internal = {qid: laya.agent.Agent._to_internal(req["questions"][qid]) for qid in ids}
        for qid, item in zip(ids, agent._encode_state(req["state"], ids, internal)):
            out.append((req.get("id", f"request-{skip + n}"), qid, list(item["ids"]), list(item["markers"]),
                        int(item["qtype"])))
    return out


def request_rows(agent, path, skip):
    """[(request id, qid, input_ids)] of `request_items`, distinct layouts only, in file order."""
    rows, seen = [], set()
    for rid, qid, ids, _, _ in request_items(agent, path, skip):
        key = tuple(ids)
        if key in seen:
            continue
        seen.add(key)
        rows.append((rid, qid, ids))
    return rows


def stack_rows(rows, table, pad_id, L, local_attention):
    emb = np.concatenate([R.embeds(table, ids, pad_id, L) for _, _, ids in rows])
    lens = np.array([len(ids) for _, _, ids in rows], dtype=np.int32)
    ids = np.full((len(rows), L), pad_id, dtype=np.int32)
    for k, (_, _, r) in enumerate(rows):
        ids[k, : len(r)] = r
    return emb, lens, ids


@torch.no_grad()
def torch_hidden(wrap, emb, lens, L, local_attention):
    outs = []
    for k in range(len(lens)):
        g, s = R.masks(int(lens[k]), L, local_attention)
        outs.append(wrap(torch.from_numpy(emb[k : k + 1]), torch.from_numpy(g), torch.from_numpy(s)).numpy())
    return np.concatenate(outs)


def run_onnx(path, emb, lens, L, local_attention):
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        run = lambda feeds: sess.run(["hidden"], feeds)[0]  # noqa: E731
        how = f"onnxruntime {ort.__version__} CPU"
    except ImportError:
        import onnx
        from onnx.reference import ReferenceEvaluator
        ev = ReferenceEvaluator(onnx.load(path))
        run = lambda feeds: ev.run(["hidden"], feeds)[0]  # noqa: E731
        how = f"onnx.reference {onnx.__version__}"
    outs = []
    for k in range(len(lens)):
        g, s = R.masks(int(lens[k]), L, local_attention)
        outs.append(run({"inputs_embeds": emb[k : k + 1], "gmask": g, "smask": s}))
    return np.concatenate(outs), how


def valid_diff(a, b, lens):
    return float(max(np.abs(a[k, :n] - b[k, :n]).max() for k, n in enumerate(lens)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "tools", "qnn", "build"))
    ap.add_argument("--models", nargs="*", default=list(R.MODELS))
    ap.add_argument("--lengths", nargs="*", type=int, default=list(R.LENGTHS))
    ap.add_argument("--checkpoint", help="export this checkpoint directory (as it is, never snapped) instead of the "
                                         "fixture models; needs --name and --requests")
    ap.add_argument("--name", help="output name for --checkpoint: <build>/<name>, tests/fixtures/qnn/<name>")
    ap.add_argument("--requests", help="JSON lines of requests (or {\"request\": ...}) the rows are laid out from")
    ap.add_argument("--skip-requests", type=int, default=0, help="leave out the first N requests of --requests")
    ap.add_argument("--heldout-requests", help="with --checkpoint: the eval rows (fidelity report) come from these "
                                               "requests, the calibration rows from --requests only")
    ap.add_argument("--eval-rows", type=int, default=R.N_EVAL, help="held-out rows per L (refs included)")
    ap.add_argument("--cal-rows", type=int, default=R.N_CAL, help="calibration rows per L")
    ap.add_argument("--no-snap", action="store_true",
                    help="export the fixture checkpoints as they are (plain post-training quantization); by default the "
                         "encoder weights are put on their uint8 grid and the snapped checkpoint is written to "
                         "tests/fixtures/qnn/<model>/checkpoint")
    a = ap.parse_args()
    import laya
    import onnx
    import transformers

    if a.checkpoint:
        if not (a.name and a.requests):
            ap.error("--checkpoint needs --name and --requests")
        jobs = [(a.name, os.path.abspath(a.checkpoint))]
    else:
        jobs = [(m, os.path.join(REPO, R.FIXTURES, "models", m)) for m in a.models]
    for model, ckpt in jobs:
        agent, enc = load_encoder(ckpt)
        snapped = [] if a.no_snap or a.checkpoint else snap_encoder(enc)
        if snapped:
            write_checkpoint(model, enc, snapped, os.path.join(REPO, "tests", "fixtures", "qnn", model, "checkpoint"))
        cfg = enc.config
        local_attention = int(cfg.local_attention)
        pad_id = int(cfg.pad_token_id)
        table = enc.embeddings.tok_embeddings.weight.detach().float().numpy()
        wrap = EncoderWrap(enc).eval()
        held = None
        if a.checkpoint:
            rows = request_rows(agent, os.path.abspath(a.requests), a.skip_requests)
            if a.heldout_requests:
                seen = {tuple(r[2]) for r in rows}
                held = [r for r in request_rows(agent, os.path.abspath(a.heldout_requests), 0) if tuple(r[2]) not in seen]
            command = (f"{show(sys.executable)} "
                       f"tools/qnn/export_encoder.py --build {show(a.build)} --checkpoint "
                       f"{show(ckpt)} --name {model} --requests {show(a.requests)} "
                       f"--skip-requests {a.skip_requests}"
                       + (f" --heldout-requests {show(a.heldout_requests)}" if held else "")
                       + (f" --eval-rows {a.eval_rows}" if a.eval_rows != R.N_EVAL else "")
                       + (f" --cal-rows {a.cal_rows}" if a.cal_rows != R.N_CAL else ""))
        else:
            rows = R.load_rows(REPO, model)
            command = "/work/venv/bin/python tools/qnn/export_encoder.py --build tools/qnn/build"
        out_dir = os.path.join(a.build, model)
        os.makedirs(out_dir, exist_ok=True)
        for L in a.lengths:
            if held is None:
                ref, ev, cal = R.split_rows(rows, L, n_eval=a.eval_rows, n_cal=a.cal_rows)
            else:
                ref, ev, cal = R.split_heldout(rows, held, L, n_eval=a.eval_rows, n_cal=a.cal_rows)
            sets = {}
            for name, rs in (("ref", ref), ("eval", ev), ("cal", cal)):
                sets[name] = stack_rows(rs, table, pad_id, L, local_attention)

            # (a) explicit masks + eager == laya's own call path (sdpa, 2-D attention_mask) on real tokens
            emb, lens, ids = sets["eval"]
            hid_eval = torch_hidden(wrap, emb, lens, L, local_attention)
            with torch.no_grad():
                enc.set_attn_implementation("sdpa") if hasattr(enc, "set_attn_implementation") else None
                am = (np.arange(L)[None, :] < lens[:, None]).astype(np.int64)
                laya_h = enc(input_ids=torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(am)).last_hidden_state.numpy()
                if hasattr(enc, "set_attn_implementation"):
                    enc.set_attn_implementation("eager")
            d_laya = valid_diff(hid_eval, laya_h, lens)
            hid_ref = hid_eval[: len(ref)]

            # export
            path = os.path.join(out_dir, f"encoder_L{L}.onnx")
            g, s = R.masks(int(lens[0]), L, local_attention)
            t0 = time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    wrap,
                    (torch.from_numpy(emb[:1]), torch.from_numpy(g), torch.from_numpy(s)),
                    path,
                    input_names=["inputs_embeds", "gmask", "smask"],
                    output_names=["hidden"],
                    opset_version=OPSET,
                    do_constant_folding=True,
                    dynamo=False,
                )
            m = onnx.load(path)
            onnx.checker.check_model(m)
            m = onnx.shape_inference.infer_shapes(m)
            onnx.save(m, path)
            t_export = time.time() - t0

            # (b) ONNX vs PyTorch
            hid_onnx, how = run_onnx(path, emb, lens, L, local_attention)
            d_onnx_valid = valid_diff(hid_eval, hid_onnx, lens)
            d_onnx_all = float(np.abs(hid_eval - hid_onnx).max())

            np.savez(
                os.path.join(out_dir, f"rows_L{L}.npz"),
                **{f"{k}_embeds": v[0] for k, v in sets.items()},
                **{f"{k}_lens": v[1] for k, v in sets.items()},
                **{f"{k}_ids": v[2] for k, v in sets.items()},
                ref_hidden=hid_ref,
                eval_hidden=hid_eval,
                table=table,
            )
            ops = sorted({n.op_type for n in m.graph.node})
            meta = {
                "model": model,
                "L": L,
                "d": int(cfg.hidden_size),
                "local_attention": local_attention,
                "pad_token_id": pad_id,
                "layer_types": list(cfg.layer_types),
                "weights_snapped_to_uint8_grid": snapped,
                "checkpoint": (f"tests/fixtures/qnn/{model}/checkpoint" if snapped
                               else show(ckpt)),
                "rows_from": (f"{show(a.requests)} after the first {a.skip_requests} "
                              "requests, laid out by laya.Agent._encode_state"
                              + (f"; eval rows from {show(a.heldout_requests)}" if held else "")
                              if a.checkpoint
                              else f"{R.FIXTURES}/cases.jsonl layouts"),
                "export_command": command,
                "opset": OPSET,
                "exporter": "torch.onnx.export(dynamo=False), do_constant_folding=True",
                "onnx_nodes": len(m.graph.node),
                "onnx_ops": ops,
                "rows": {k: [f"{c}:{q}:{len(i)}" for c, q, i in rs] for k, rs in (("ref", ref), ("eval", ev), ("cal", cal))},
                "check_eager_masks_vs_laya_sdpa_max_abs_valid": d_laya,
                "check_onnx_vs_torch": {"runner": how, "max_abs_valid": d_onnx_valid, "max_abs_all": d_onnx_all, "rows": "eval"},
                "versions": {
                    "python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                    "laya": getattr(laya, "__version__", "0.3.20"), "onnx": onnx.__version__, "numpy": np.__version__,
                },
                "export_seconds": round(t_export, 2),
            }
            with open(os.path.join(out_dir, f"export_L{L}.json"), "w") as f:
                json.dump(meta, f, indent=1)
            print(f"{model} L={L}: nodes={len(m.graph.node)} ref={len(ref)} eval={len(ev)} cal={len(cal)} "
                  f"laya-vs-eager={d_laya:.2e} onnx-vs-torch(valid)={d_onnx_valid:.2e} (all)={d_onnx_all:.2e} [{how}]",
                  flush=True)


if __name__ == "__main__":
    main()
