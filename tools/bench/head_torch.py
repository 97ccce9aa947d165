"""laya 0.3.20's decision head on PyTorch CPU: time per question at L=128 and 256, side by side
with `cargo bench --bench qnn_host_steps` (issue #16, item 4a).

The checkpoint is loaded by laya.Agent; its encoder is swapped for a stub returning fixed hidden
states, so `DecisionModel.forward` runs laya's own head code on them: type embedding, the
TransformerEncoder layers with the key-padding mask, the marker gather, the scorer and the act
head. One full row (every position a real token), four markers at 1, 9, 17, 25, as the Rust
bench. 2 threads unless --threads.

    python tools/bench/head_torch.py --model /tmp/laya-1024 [--iters 20] [--threads 2]
"""
import argparse
import json
import time
import types

import torch

import laya


class FixedHidden(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden = None

    def forward(self, input_ids=None, attention_mask=None):
        return types.SimpleNamespace(last_hidden_state=self.hidden)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    agent = laya.Agent(args.model, device="cpu")
    model = agent.model
    model.eval()
    d = model.encoder.config.hidden_size
    model.encoder = FixedHidden(model.encoder.config)
    out = {"impl": "laya-0.3.20-head-pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "d": d, "head_layers": len(model.head.layers) if model.head is not None else 0, "iters": args.iters}
    g = torch.Generator().manual_seed(0)
    for L in (128, 256):
        model.encoder.hidden = torch.randn(1, L, d, generator=g)
        ids = torch.ones(1, L, dtype=torch.long)
        mask = torch.ones(1, L, dtype=torch.long)
        mpos = torch.tensor([[1, 9, 17, 25]])
        mmask = torch.ones(1, 4, dtype=torch.bool)
        qtype = torch.zeros(1, dtype=torch.long)
        with torch.inference_mode():
            model(ids, mask, mpos, mmask, qtype)
            t = time.perf_counter()
            for _ in range(args.iters):
                model(ids, mask, mpos, mmask, qtype)
            dt = (time.perf_counter() - t) / args.iters
        out[f"head_ms_L{L}"] = round(dt * 1e3, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
