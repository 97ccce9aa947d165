"""ONNX Runtime's MatMul (MLAS) alone at the CPU model's linear-layer shapes: GFLOP/s, best of
--iters, to set beside the panels' own figures (BENCHMARKS.md, "Where a layer's time goes").

One graph per shape: tokens [n, depth] times a constant weight [depth, rows], as an exported
linear layer is. 1 thread unless --threads.

    python tools/bench/ort_matmul.py [--threads 1] [--iters 10]
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = [(3072, 1024, 100), (3072, 1024, 192), (3072, 1024, 512), (1024, 2624, 100), (5248, 1024, 100)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for rows, depth, n in SHAPES:
        w = rng.random((depth, rows), dtype=np.float32) - 0.5
        x = rng.random((n, depth), dtype=np.float32)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "linear",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, depth])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, rows])],
            [numpy_helper.from_array(w, "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        best = float("inf")
        for _ in range(args.iters):
            t = time.perf_counter()
            session.run(None, {"x": x})
            best = min(best, time.perf_counter() - t)
        print(f"{rows}x{depth} by {n}: ORT {ort.__version__} MatMul {2 * rows * depth * n / best / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
