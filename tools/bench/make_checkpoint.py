"""Build a random laya checkpoint of a chosen size for benchmarks (never committed).

Uses laya's own build_model, the fixture bpe-t5 tokenizer and rl_agent_config, and the encoder
dimensions given on the command line. The vocabulary stays the fixture tokenizer's (1100), which
changes the embedding table's size but not the compute per token, unless --tokenizer gives another
(tools/bench/memory.py uses a 50280-token one, ModernBERT's vocabulary size, trained locally).

    /work/venv/bin/python tools/bench/make_checkpoint.py --out /tmp/laya-mid \
        --hidden 768 --layers 22 --heads 12 --intermediate 1152 --local-attention 128
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

from laya.common import build_model

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "laya-0.3.20", "models", "bpe-t5")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=1152)
    ap.add_argument("--local-attention", type=int, default=128)
    ap.add_argument("--separated-seed", type=int,
                    help="redraw every weight like the test fixtures (tools/fixtures/generate.py init_and_scale: "
                         "1/sqrt(fan_in), encoder x9/8, scorer x10) with this seed, so answers are well separated; "
                         "the default (transformers' 0.02 init) gives near-uniform answers")
    ap.add_argument("--tokenizer",
                    help="a tokenizer directory to use instead of the fixture's (1100 tokens), e.g. one of a real "
                         "vocabulary's size; the embedding table takes its vocabulary size")
    args = ap.parse_args()

    os.makedirs(os.path.join(args.out, "encoder"), exist_ok=True)
    tok_dir = args.tokenizer or os.path.join(FIXTURE, "tokenizer")
    shutil.copytree(tok_dir, os.path.join(args.out, "tokenizer"), dirs_exist_ok=True)
    with open(os.path.join(FIXTURE, "encoder", "config.json")) as f:
        enc = json.load(f)
    if args.tokenizer:
        from tokenizers import Tokenizer
        enc["vocab_size"] = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")).get_vocab_size()
    enc.update(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
               intermediate_size=args.intermediate, local_attention=args.local_attention,
               layer_types=["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(args.layers)])
    with open(os.path.join(args.out, "encoder", "config.json"), "w") as f:
        json.dump(enc, f, indent=2)
    with open(os.path.join(FIXTURE, "rl_agent_config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(args.out, "rl_agent_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    torch.manual_seed(0)
    model = build_model(cfg, encoder_dir=os.path.join(args.out, "encoder"), pretrained=False)
    if args.separated_seed is not None:
        import math
        g = torch.Generator().manual_seed(args.separated_seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                if p.dim() == 1:
                    base = torch.randn(p.shape, generator=g) * 0.1
                    p.copy_(1.0 + base if name.endswith(".weight") else base)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            for name, p in model.named_parameters():
                if name.startswith("encoder.") and p.dim() == 2 and "embeddings" not in name:
                    p.mul_(9.0 / 8.0)
            model.type_emb.weight.mul_(2.0)
            model.scorer[3].weight.mul_(10.0)
            model.act_head[2].weight.mul_(2.0)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(args.out, "model.safetensors"))
    print("wrote", args.out, sum(p.numel() for p in model.parameters()), "parameters")


if __name__ == "__main__":
    main()
