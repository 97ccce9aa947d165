"""A tokenizer of ModernBERT's vocabulary size (50280 tokens) for memory benchmarks (never committed).

The fixture tokenizer (tests/fixtures/laya-0.3.20/models/bpe-t5/tokenizer) is a byte-level BPE of
1100 tokens; the agent's memory depends on the vocabulary's size, so tools/bench/memory.py also
runs a checkpoint whose tokenizer is that same pipeline (normalizer, byte-level pre-tokenizer,
post-processor, special tokens at the same ids) retrained to 50280 tokens on local text (the
Python standard library's larger modules). Nothing is downloaded.

    /work/venv-demo/bin/python tools/bench/make_tokenizer.py --out /tmp/tok50k
    /work/venv-demo/bin/python tools/bench/make_checkpoint.py --out /tmp/laya-small-tok50k --hidden 256 \
        --layers 6 --heads 4 --intermediate 384 --local-attention 64 --tokenizer /tmp/tok50k/tokenizer
"""
import argparse
import glob
import os
import shutil
import sysconfig

from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel
from tokenizers.trainers import BpeTrainer

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "laya-0.3.20", "models", "bpe-t5",
                       "tokenizer")
SPECIAL = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=50280)
    args = ap.parse_args()
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)
                   if os.path.getsize(f) > 20_000)
    tok = Tokenizer.from_file(os.path.join(FIXTURE, "tokenizer.json"))
    trainer = BpeTrainer(vocab_size=args.vocab, special_tokens=SPECIAL, initial_alphabet=ByteLevel.alphabet(),
                         show_progress=False)
    tok.train(files, trainer)
    ids = [tok.token_to_id(t) for t in SPECIAL]
    fixture_ids = [Tokenizer.from_file(os.path.join(FIXTURE, "tokenizer.json")).token_to_id(t) for t in SPECIAL]
    assert ids == fixture_ids, (ids, fixture_ids)
    out = os.path.join(args.out, "tokenizer")
    shutil.copytree(FIXTURE, out, dirs_exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    print("wrote", out, tok.get_vocab_size(), "tokens from", len(files), "files")


if __name__ == "__main__":
    main()
