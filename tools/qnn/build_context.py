#!/usr/bin/env python3
"""Quantize the exported encoders (QDQ w8a16), compile HTP v68 context binaries with ONNX Runtime's
QNN EP, describe them from the binary itself, and record reference outputs.

Runs in /work/qnn-venv (onnxruntime-qnn==2.7.0, onnx, numpy), after export_encoder.py:

    /work/qnn-venv/bin/python tools/qnn/build_context.py --build tools/qnn/build --out tests/fixtures/qnn

Per model and L:
  1. qnn_preprocess_model (constant folding, Erf->Gelu fusion) -> <build>/<model>/pre_L<L>.onnx
  2. QDQ quantization with get_qnn_qdq_config(activation_type=QUInt16, weight_type=QUInt8), calibrated
     on the `cal` rows of rows_L<L>.npz (real token embeddings, masks from the row length).
     The mask inputs are calibrated on masks clipped at -MASK_CLIP (default 100): with the raw
     finfo(float32).min values the mask inputs and the scores+mask Add outputs get a uint16 scale of
     ~5e33 and every attention score rounds to the zero point (attention collapses to a uniform average,
     Pearson ~0.8). At run time the boundary Quantize (or the host) saturates finfo.min to q=0, i.e.
     to -MASK_CLIP, and exp(-100) is 0 in float32, so the masking semantics are unchanged.
     Calibration method: L=128 min-max; L=256 the best of the candidates in CANDIDATES_256 by mean
     Pearson of the CPU-EP QDQ model against PyTorch on the held-out eval rows (all numbers recorded).
  3. Two flavours, each compiled to an EPContext model + separate .bin (ep.context_embed_mode=0):
       f32io: the QDQ graph as is (float32 inputs/outputs; Quantize/Dequantize run inside the binary)
       u16io: boundary QuantizeLinear on inputs and DequantizeLinear on outputs removed, so the graph
              takes and returns uint16 (QNN UFIXED_POINT_16) and the host quantizes/dequantizes.
  4. Graph/tensor names, data types, dims and scale/offset read from the .bin with libQnnSystem.so
     (qnn_binary_info.py), cross-checked against the ONNX Q/DQ parameters.
  5. The EPContext model run on the QNN EP (HTP simulator) for the ref and eval rows; ref inputs/outputs
     saved as .npy, fidelity vs the float PyTorch encoder recorded.
"""
import argparse
import json
import os
import platform
import shutil
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxruntime as ort
import onnxruntime_qnn as oq
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qnn_binary_info  # noqa: E402
import qnn_rows as R  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HTP_ARCH = "68"
INPUTS = ("inputs_embeds", "gmask", "smask")
OUTPUTS = ("hidden",)
CALIB = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}
CANDIDATES_256 = ("minmax", "percentile")
# the names the sidecar JSON's top-level "calibration" uses (laya-bundle.json's vocabulary)
CALIB_LABEL = {"minmax": "min-max", "percentile": "percentile"}

_EP_REGISTERED = False


def qnn_devices():
    global _EP_REGISTERED
    if not _EP_REGISTERED:
        ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
        _EP_REGISTERED = True
    return [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]


def qnn_options():
    return {"backend_path": oq.get_qnn_htp_path(), "htp_arch": HTP_ARCH}


class Reader(CalibrationDataReader):
    def __init__(self, z, L, la, clip):
        self.z, self.L, self.la, self.clip, self.i = z, L, la, clip, 0

    def get_next(self):
        if self.i >= len(self.z["cal_lens"]):
            return None
        k = self.i
        self.i += 1
        g, s = R.masks(int(self.z["cal_lens"][k]), self.L, self.la)
        if self.clip:
            g, s = np.maximum(g, -self.clip), np.maximum(s, -self.clip)
        return {"inputs_embeds": self.z["cal_embeds"][k : k + 1], "gmask": g, "smask": s}


def feeds(z, prefix, k, L, la):
    g, s = R.masks(int(z[f"{prefix}_lens"][k]), L, la)
    return {"inputs_embeds": z[f"{prefix}_embeds"][k : k + 1], "gmask": g, "smask": s}


def fidelity(outs, ref, lens):
    """Pearson and max abs diff over the real (non-padding) positions, per row and overall."""
    per = []
    for k, n in enumerate(lens):
        a, b = outs[k, :n].ravel().astype(np.float64), ref[k, :n].ravel().astype(np.float64)
        per.append({"len": int(n), "pearson": float(np.corrcoef(a, b)[0, 1]), "max_abs": float(np.abs(a - b).max())})
    return {
        "pearson_mean": float(np.mean([p["pearson"] for p in per])),
        "pearson_min": float(np.min([p["pearson"] for p in per])),
        "max_abs": float(np.max([p["max_abs"] for p in per])),
        "rows": len(per),
        "positions": "real tokens only (padding positions excluded)",
    }


def cpu_fidelity(path, z, L, la):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = np.concatenate([s.run(["hidden"], feeds(z, "eval", k, L, la))[0] for k in range(len(z["eval_lens"]))])
    return fidelity(outs, z["eval_hidden"], z["eval_lens"])


def quantize_model(pre, out, z, L, la, method, clip):
    cfg = get_qnn_qdq_config(pre, Reader(z, L, la, clip), calibrate_method=CALIB[method],
                             activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    quantize(pre, out, cfg)


def weight_grid_error(pre, qdq):
    """The largest |DequantizeLinear(uint8 weight) - float weight| over the QDQ model's uint8
    initializers: 0 when the export snapped the weights onto their grid (export_encoder.py)."""
    from onnx import numpy_helper
    src = {i.name: numpy_helper.to_array(i) for i in onnx.load(pre).graph.initializer}
    q = onnx.load(qdq)
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    worst, n = 0.0, 0
    for node in q.graph.node:
        if node.op_type != "DequantizeLinear" or inits.get(node.input[0], np.zeros(0)).dtype != np.uint8:
            continue
        base = node.input[0].removesuffix("_quantized")
        if base not in src:
            continue
        w, sc, zp = inits[node.input[0]], inits[node.input[1]], inits[node.input[2]]
        deq = (w.astype(np.float32) - zp.astype(np.float32)) * sc
        worst, n = max(worst, float(np.abs(deq - src[base]).max())), n + 1
    return {"uint8_weights": n, "max_abs_dequantized_minus_float": worst}


def strip_boundary_qdq(src, dst):
    """Remove the QuantizeLinear after each graph input and the DequantizeLinear before each graph output.

    The graph input keeps its name and becomes uint16 (fed straight into the DequantizeLinear nodes that
    consumed the removed Quantize's output); the graph output keeps its name and becomes the uint16 output
    of the QuantizeLinear that fed the removed Dequantize. Returns {name: (scale, zero_point)}.
    """
    m = onnx.load(src)
    g = m.graph
    init = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    params = {}
    drop = []
    for gi in g.input:
        qs = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == gi.name]
        others = [n for n in g.node if gi.name in n.input and n not in qs]
        assert len(qs) == 1 and not others, (gi.name, len(qs), len(others))
        q = qs[0]
        scale, zp = init[q.input[1]], init[q.input[2]]
        params[gi.name] = (float(scale), int(zp), str(zp.dtype))
        for n in g.node:
            for i, x in enumerate(n.input):
                if x == q.output[0]:
                    n.input[i] = gi.name
        gi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(zp.dtype)
        drop.append(q)
    for go in g.output:
        dq = [n for n in g.node if n.op_type == "DequantizeLinear" and n.output[0] == go.name]
        assert len(dq) == 1, go.name
        dq = dq[0]
        qname = dq.input[0]
        scale, zp = init[dq.input[1]], init[dq.input[2]]
        params[go.name] = (float(scale), int(zp), str(zp.dtype))
        users = [n for n in g.node if qname in n.input and n is not dq]
        assert not users, f"{qname} has other consumers"
        for n in g.node:
            for i, x in enumerate(n.output):
                if x == qname:
                    n.output[i] = go.name
        go.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(zp.dtype)
        drop.append(dq)
    for n in drop:
        g.node.remove(n)
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    return params


def shift_input_zero_point(src, dst, name, shift):
    """A deliberately broken copy of a QDQ model for negative fixtures: the QuantizeLinear that reads graph
    input `name` gets its own zero point, `shift` steps away from the one its DequantizeLinear uses, so the
    compiled binary quantizes its float input on one grid and reads it back on another. Returns the record."""
    m = onnx.load(src)
    g = m.graph
    init = {i.name: i for i in g.initializer}
    q = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == name]
    if name in OUTPUTS:  # the QuantizeLinear feeding the output's DequantizeLinear
        dq = [n for n in g.node if n.op_type == "DequantizeLinear" and n.output[0] == name]
        q = [n for n in g.node if n.op_type == "QuantizeLinear" and n.output[0] == dq[0].input[0]]
    assert len(q) == 1, name
    q = q[0]
    zp = numpy_helper.to_array(init[q.input[2]])
    info = np.iinfo(zp.dtype)
    bad = np.clip(zp.astype(np.int64) + shift, info.min, info.max).astype(zp.dtype)
    t = numpy_helper.from_array(bad, q.input[2] + "_bad_offset")
    g.initializer.append(t)
    q.input[2] = t.name
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    return {"tensor": name, "quantize_zero_point": int(bad), "dequantize_zero_point": int(zp), "shift": int(shift),
            "note": "NEGATIVE FIXTURE: the binary quantizes this input with a zero point its own graph does not use"}


def boundary_params(path):
    """{name: (scale, zero_point, dtype)} of the boundary Q (inputs) / DQ (outputs) of a QDQ model."""
    m = onnx.load(path)
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in INPUTS or n.op_type == "DequantizeLinear" and n.output[0] in OUTPUTS:
            name = n.input[0] if n.op_type == "QuantizeLinear" else n.output[0]
            zp = init[n.input[2]]
            out[name] = (float(init[n.input[1]]), int(zp), str(zp.dtype))
    return out


def compile_ctx(src, ctx_path):
    so = ort.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_session_config_entry("ep.context_file_path", ctx_path)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.log_severity_level = 3
    so.add_provider_for_devices(qnn_devices(), qnn_options())
    t0 = time.time()
    ort.InferenceSession(src, sess_options=so)
    return time.time() - t0


def qnn_session(ctx_path):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.log_severity_level = 3
    so.add_provider_for_devices(qnn_devices(), qnn_options())
    return ort.InferenceSession(ctx_path, sess_options=so)


def q16(x, scale, zp):
    return np.clip(np.round(np.asarray(x, np.float64) / scale) + zp, 0, 65535).astype(np.uint16)


def dq16(q, scale, zp):
    return ((q.astype(np.float32) - zp) * scale).astype(np.float32)


def epcontext_attrs(ctx_path):
    m = onnx.load(ctx_path)
    nodes = [n for n in m.graph.node if n.op_type == "EPContext"]
    attrs = {}
    for a in nodes[0].attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = v.decode() if isinstance(v, bytes) else v
    io = {"inputs": [(i.name, TensorProto.DataType.Name(i.type.tensor_type.elem_type)) for i in m.graph.input],
          "outputs": [(o.name, TensorProto.DataType.Name(o.type.tensor_type.elem_type)) for o in m.graph.output]}
    return len(nodes), attrs, io


def rel(p):
    return os.path.relpath(p, REPO)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "tools", "qnn", "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "qnn"))
    ap.add_argument("--models", nargs="*", default=list(R.MODELS))
    ap.add_argument("--lengths", nargs="*", type=int, default=list(R.LENGTHS))
    ap.add_argument("--mask-clip", type=float, default=100.0,
                    help="calibrate the mask inputs on max(mask, -clip); 0 = raw finfo.min masks")
    ap.add_argument("--no-refs", action="store_true",
                    help="write no refs/ (reference inputs/outputs), only the binaries and their descriptions")
    ap.add_argument("--calibration", choices=("auto",) + tuple(CALIB), default="auto",
                    help="auto: min-max at 128, the best of CANDIDATES_256 at 256 (default); or force one method")
    ap.add_argument("--flavours", nargs="*", default=["f32io", "u16io"], choices=["f32io", "u16io"])
    ap.add_argument("--subdir", help="write to <out>/<subdir> instead of <out>/<model> (one model only)")
    ap.add_argument("--tag", default="", help="appended to the output names: enc_L<L>_<flavour><tag>")
    ap.add_argument("--bad-input-offset", type=int, default=0,
                    help="NEGATIVE FIXTURES ONLY: shift the zero point of the inputs_embeds boundary QuantizeLinear "
                         "(not its DequantizeLinear) by this many uint16 steps, so the binary misreads its inputs")
    ap.add_argument("--bad-offset-tensor", default="inputs_embeds", choices=INPUTS + OUTPUTS,
                    help="the tensor --bad-input-offset breaks (for an output: the QuantizeLinear before its "
                         "boundary DequantizeLinear)")
    a = ap.parse_args()
    if a.bad_input_offset and "u16io" in a.flavours:
        ap.error("--bad-input-offset is for f32io only (u16io has no boundary QuantizeLinear)")
    sys_lib = os.path.join(os.path.dirname(oq.get_qnn_htp_path()), "libQnnSystem.so")
    versions = {
        "python": platform.python_version(), "onnxruntime": ort.__version__, "onnxruntime-qnn": oq.__version__,
        "qnn_sdk (wheel)": getattr(oq.build_and_package_info, "qnn_version", None), "onnx": onnx.__version__,
        "numpy": np.__version__, "htp_arch": int(HTP_ARCH),
    }
    if a.subdir and len(a.models) != 1:
        ap.error("--subdir takes one model")
    show = lambda p: rel(os.path.abspath(p)) if os.path.abspath(p).startswith(REPO + os.sep) else p  # noqa: E731
    build_arg, out_arg = show(a.build), show(a.out)
    summary = []
    for model in a.models:
        bdir = os.path.join(a.build, model)
        odir = os.path.join(a.out, a.subdir or model)
        rdir = os.path.join(odir, "refs")
        os.makedirs(odir if a.no_refs else rdir, exist_ok=True)
        for L in a.lengths:
            meta = json.load(open(os.path.join(bdir, f"export_L{L}.json")))
            la = meta["local_attention"]
            z = dict(np.load(os.path.join(bdir, f"rows_L{L}.npz")))
            pre = os.path.join(bdir, f"pre_L{L}.onnx")
            if not qnn_preprocess_model(os.path.join(bdir, f"encoder_L{L}.onnx"), pre):
                shutil.copy(os.path.join(bdir, f"encoder_L{L}.onnx"), pre)

            # --- calibration choice ---
            t0 = time.time()
            tried = {}
            if a.calibration != "auto":
                cands = [a.calibration]
            elif L == 128:
                cands = ["minmax"]
            else:
                cands = list(CANDIDATES_256)
            for meth in cands:
                for clip in sorted({a.mask_clip, 0.0}, reverse=True):
                    tag = f"{meth}_clip{int(clip)}"
                    path = os.path.join(bdir, f"qdq_L{L}_{tag}.onnx")
                    quantize_model(pre, path, z, L, la, meth, clip)
                    tried[tag] = {"calibration": meth, "mask_clip": clip, "cpu_qdq_vs_torch": cpu_fidelity(path, z, L, la),
                                  "path": path}
                    print(f"  {model} L={L} {tag}: {tried[tag]['cpu_qdq_vs_torch']['pearson_mean']:.5f}", flush=True)
            ok = {k: v for k, v in tried.items() if v["mask_clip"] == a.mask_clip}
            best = max(ok, key=lambda k: ok[k]["cpu_qdq_vs_torch"]["pearson_mean"])
            calib = tried[best]
            qdq = calib["path"]
            t_quant = time.time() - t0
            grid = weight_grid_error(pre, qdq)

            # --- flavours ---
            strip_path = os.path.join(bdir, f"qdq_L{L}_{best}_u16io.onnx")
            u16_params = strip_boundary_qdq(qdq, strip_path)
            f32_params = boundary_params(qdq)
            assert f32_params == u16_params, (f32_params, u16_params)
            bad_offset = None
            if a.bad_input_offset:
                bad = os.path.join(bdir, f"qdq_L{L}_{best}_badoffset_{a.bad_offset_tensor}{a.bad_input_offset}.onnx")
                bad_offset = shift_input_zero_point(qdq, bad, a.bad_offset_tensor, a.bad_input_offset)
                qdq = bad

            ref_lens = z["ref_lens"]
            if not a.no_refs:
                np.save(os.path.join(rdir, f"L{L}_inputs_embeds.npy"), z["ref_embeds"])
                np.save(os.path.join(rdir, f"L{L}_torch_hidden.npy"), z["ref_hidden"])
                with open(os.path.join(rdir, f"L{L}_rows.json"), "w") as f:
                    json.dump({"rows": meta["rows"]["ref"], "lens": [int(x) for x in ref_lens],
                               "input_ids": [[int(t) for t in r[:n]] for r, n in zip(z["ref_ids"], ref_lens)],
                               "local_attention": la, "pad_token_id": meta["pad_token_id"], "L": L,
                               "masks": "not stored: gmask[0,0,i,j] = 0 if j < len else finfo(f32).min; smask additionally "
                                        "finfo.min where |i-j| > local_attention//2 (tools/qnn/qnn_rows.py masks())"}, f, indent=1)
                    f.write("\n")

            for flavour, src in (("f32io", qdq), ("u16io", strip_path)):
                if flavour not in a.flavours:
                    continue
                name = f"enc_L{L}_{flavour}{a.tag}"
                ctx = os.path.join(odir, f"{name}_ctx.onnx")
                for old in (ctx, os.path.join(odir, f"{name}_ctx_qnn.bin")):
                    if os.path.exists(old):
                        os.remove(old)
                t_comp = compile_ctx(src, ctx)
                n_ep, attrs, ctx_io = epcontext_attrs(ctx)
                bin_path = os.path.join(odir, attrs["ep_cache_context"])
                info = qnn_binary_info.binary_info(bin_path, sys_lib)

                # run on the simulator
                sess = qnn_session(ctx)

                def run(prefix, k):
                    fd = feeds(z, prefix, k, L, la)
                    if flavour == "u16io":
                        fdq = {n: q16(v, *u16_params[n][:2]) for n, v in fd.items()}
                        hq = sess.run(["hidden"], fdq)[0]
                        return fdq, hq, dq16(hq, *u16_params["hidden"][:2])
                    h = sess.run(["hidden"], fd)[0]
                    return fd, h, h

                t1 = time.time()
                ev = [run("eval", k)[2] for k in range(len(z["eval_lens"]))]
                t_run = (time.time() - t1) / len(ev)
                # for fidelity_report.py (decisions of the float model vs this binary on the held-out rows)
                np.save(os.path.join(bdir, f"sim_{name}_eval_hidden.npy"), np.concatenate(ev))
                fid_eval = fidelity(np.concatenate(ev), z["eval_hidden"], z["eval_lens"])
                refs = [run("ref", k) for k in range(len(ref_lens))]
                fid_ref = fidelity(np.concatenate([r[2] for r in refs]), z["ref_hidden"], ref_lens)
                files = {}
                if a.no_refs:
                    pass
                elif flavour == "u16io":
                    arr = np.concatenate([r[0]["inputs_embeds"] for r in refs])
                    files["inputs_embeds_u16"] = f"refs/{name}_inputs_embeds.npy"
                    np.save(os.path.join(odir, files["inputs_embeds_u16"]), arr)
                    arr = np.concatenate([r[1] for r in refs])
                    files["hidden_u16"] = f"refs/{name}_hidden.npy"
                    np.save(os.path.join(odir, files["hidden_u16"]), arr)
                else:
                    arr = np.concatenate([r[1] for r in refs])
                    files["hidden_f32"] = f"refs/{name}_hidden.npy"
                    np.save(os.path.join(odir, files["hidden_f32"]), arr)

                # names as compiled vs ONNX names
                g = info["graphs"][0]
                tensors = []
                for role, lst in (("input", g["inputs"]), ("output", g["outputs"])):
                    for t in lst:
                        onnx_name = next((n for n in INPUTS + OUTPUTS if t["name"] == n or t["name"].startswith(n)), None)
                        ent = {"role": role, "compiled_name": t["name"], "onnx_name": onnx_name,
                               "qnn_data_type": t["data_type"], "qnn_data_type_code": t["data_type_code"],
                               "dims": t["dims"], "qnn_tensor_type": t["type"], "quantization": t["quantization"]}
                        if flavour == "f32io" and onnx_name in f32_params:
                            s_, zp, dt = f32_params[onnx_name]
                            ent["inner_quantization_from_onnx"] = {
                                "note": "boundary Q/DQ inside the binary; the QNN tensor itself is float32",
                                "scale": s_, "zero_point": zp, "dtype": dt, "qnn_offset": -zp}
                        if flavour == "u16io" and onnx_name in u16_params:
                            s_, zp, dt = u16_params[onnx_name]
                            q = t["quantization"]
                            ent["onnx_qdq"] = {"scale": s_, "zero_point": zp, "dtype": dt}
                            ent["matches_onnx"] = bool(q.get("offset") == -zp and abs(q.get("scale", 0) - s_) <= 1e-6 * abs(s_))
                        tensors.append(ent)
                desc = {
                    "name": name,
                    # read by `laya-edge bundle --qnn` (a graph without these is treated as min-max)
                    "calibration": CALIB_LABEL[calib["calibration"]],
                    "mask_clip": calib["mask_clip"] or None,
                    "model": model,
                    "checkpoint": meta.get("checkpoint", f"{R.FIXTURES}/models/{model}"),
                    "weights_snapped_to_uint8_grid": bool(meta.get("weights_snapped_to_uint8_grid")),
                    "weight_grid": grid,
                    "L": L,
                    "d": meta["d"],
                    "local_attention": la,
                    "pad_token_id": meta["pad_token_id"],
                    "flavour": flavour,
                    "flavour_doc": ("float32 I/O: quantize/dequantize happen inside the binary" if flavour == "f32io" else
                                    "UFIXED_POINT_16 I/O: host quantizes inputs q = clamp(round(x/scale) - offset, 0, 65535) "
                                    "and dequantizes outputs x = (q + offset) * scale"),
                    "files": {"context_binary": os.path.basename(bin_path), "ctx_onnx": os.path.basename(ctx),
                              "bin_bytes": os.path.getsize(bin_path), "refs": None if a.no_refs else {
                                  "rows": f"refs/L{L}_rows.json", "inputs_embeds_f32": f"refs/L{L}_inputs_embeds.npy",
                                  "torch_hidden_f32": f"refs/L{L}_torch_hidden.npy", **files}},
                    "graph_names": [gg["name"] for gg in info["graphs"]],
                    "tensors": tensors,
                    "quant_convention": "QNN: float = (q + offset) * scale; ONNX: float = (q - zero_point) * scale; offset = -zero_point",
                    "mask_values": ({"note": "host-side quantized mask values (u16io)",
                                     "gmask_q_for_0": int(q16(np.float32(0), *u16_params["gmask"][:2])),
                                     "gmask_q_for_finfo_min": int(q16(np.float32(R.NEG), *u16_params["gmask"][:2])),
                                     "smask_q_for_0": int(q16(np.float32(0), *u16_params["smask"][:2])),
                                     "smask_q_for_finfo_min": int(q16(np.float32(R.NEG), *u16_params["smask"][:2]))}
                                    if flavour == "u16io" else None),
                    "quantization": {
                        "scheme": "QDQ, activations uint16 (per-tensor, asymmetric), weights uint8 (per-tensor), "
                                  "get_qnn_qdq_config(activation_type=QUInt16, weight_type=QUInt8)",
                        "calibration": calib["calibration"],
                        "mask_clip": calib["mask_clip"],
                        "mask_clip_doc": "mask inputs calibrated on max(mask, -mask_clip); finfo.min saturates to -mask_clip at run time",
                        "calibration_rows": len(z["cal_lens"]),
                        "bad_input_offset": bad_offset,
                        "candidates_cpu_qdq_vs_torch": {k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in tried.items()},
                    },
                    "fidelity_htp_sim_vs_torch": {"eval_rows": fid_eval, "ref_rows": fid_ref},
                    "epcontext": {"nodes": n_ep, "attributes": attrs, "ctx_onnx_io": ctx_io},
                    "binary_info": {k: v for k, v in info.items() if k != "graphs"},
                    "how_obtained": ("compiled tensor names/types/dims/scale/offset: read from the .bin with libQnnSystem.so "
                                     "(tools/qnn/qnn_binary_info.py, systemContextGetBinaryInfo); graph name also equals the "
                                     "EPContext node's partition_name; ONNX Q/DQ params from the quantized ONNX model"),
                    "commands": [
                        meta.get("export_command", "/work/venv/bin/python tools/qnn/export_encoder.py --build tools/qnn/build"),
                        f"/work/qnn-venv/bin/python tools/qnn/build_context.py --build {build_arg} --out {out_arg} "
                        f"--models {model}" + (f" --subdir {a.subdir}" if a.subdir else "") + f" --lengths {L} --mask-clip {a.mask_clip:g}" + (" --no-refs" if a.no_refs else "")
                        + (f" --calibration {a.calibration}" if a.calibration != "auto" else "")
                        + (f" --flavours {flavour} --tag {a.tag}" if a.tag else "")
                        + (f" --bad-offset-tensor {a.bad_offset_tensor} --bad-input-offset={a.bad_input_offset}" if a.bad_input_offset else ""),
                    ],
                    "compile": {"ep": "QNNExecutionProvider (plugin EP, add_provider_for_devices)",
                                "provider_options": {"backend_path": "<onnxruntime_qnn>/libQnnHtp.so", "htp_arch": HTP_ARCH},
                                "session_config": {"ep.context_enable": "1", "ep.context_embed_mode": "0",
                                                   "ep.context_file_path": rel(ctx), "session.disable_cpu_ep_fallback": "1"},
                                "seconds": round(t_comp, 2)},
                    "sim_run_seconds_per_row": round(t_run, 3),
                    "export": {k: meta[k] for k in ("opset", "exporter", "onnx_nodes", "check_onnx_vs_torch",
                                                    "check_eager_masks_vs_laya_sdpa_max_abs_valid", "versions")},
                    "versions": versions,
                }
                with open(os.path.join(odir, f"{name}.json"), "w") as f:
                    json.dump(desc, f, indent=1)
                    f.write("\n")
                line = (f"{model} L={L} {flavour}: calib={best} compile={t_comp:.1f}s quant+select={t_quant:.1f}s "
                        f"bin={os.path.getsize(bin_path)}B graph={desc['graph_names'][0]} "
                        f"pearson(eval)={fid_eval['pearson_mean']:.5f} min={fid_eval['pearson_min']:.5f} "
                        f"maxabs={fid_eval['max_abs']:.4f} weight-grid-err={grid['max_abs_dequantized_minus_float']:.2e}")
                print(line, flush=True)
                summary.append(line)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
