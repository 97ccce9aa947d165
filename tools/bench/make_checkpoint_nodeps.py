"""A random laya checkpoint for benchmarks without torch or laya (make_checkpoint.py needs both):
the bpe-t5 fixture's tensor names, config, tokenizer and rl_agent_config with the encoder's (and
the head's) width scaled, and a transformers-like init: encoder N(0, 0.02) cut at 2 sigma, output
projections divided by sqrt(2 L); head linears U(+-1/sqrt(fan_in)), biases 0, norms 1; seed 0.
Its values are not make_checkpoint.py's (BENCHMARKS.md, "int8 with `Wqkv` in f32", used it).

    python3 tools/bench/make_checkpoint_nodeps.py OUT HIDDEN LAYERS HEADS INTERMEDIATE LOCAL_ATTENTION
    python3 tools/bench/make_checkpoint_nodeps.py /tmp/quant-bench/laya-1024x2 1024 2 16 2624 128
"""
import array, json, math, os, random, shutil, struct, sys
out, H, L, heads, I, local = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
fx = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "laya-0.3.20", "models", "bpe-t5")
f = open(fx + "/model.safetensors", "rb"); n = struct.unpack("<Q", f.read(8))[0]; hdr = json.loads(f.read(n)); base = 8 + n
os.makedirs(out + "/encoder", exist_ok=True)
shutil.copytree(fx + "/tokenizer", out + "/tokenizer", dirs_exist_ok=True)
shutil.copy(fx + "/rl_agent_config.json", out)
enc = json.load(open(fx + "/encoder/config.json"))
enc.update(hidden_size=H, num_hidden_layers=L, num_attention_heads=heads, intermediate_size=I, local_attention=local,
           layer_types=["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(L)])
json.dump(enc, open(out + "/encoder/config.json", "w"), indent=2)
rng = random.Random(0)
def dims(name, shape):
    if name.startswith("encoder.layers.") and name.endswith("mlp.Wi.weight"): return [2 * I, H]
    if name.startswith("encoder.layers.") and name.endswith("mlp.Wo.weight"): return [H, I]
    m = {68: H + 4} if name.startswith("act_head") else {64: H, 256: 4 * H, 192: 3 * H, 68: H + 4}
    return [m.get(d, d) if not (name.endswith("tok_embeddings.weight") and i == 0) else d for i, d in enumerate(shape)]
tensors = {}
names = [k for k in hdr if k != "__metadata__"]
layer0 = [k for k in names if k.startswith("encoder.layers.0.")]
layer1 = [k for k in names if k.startswith("encoder.layers.1.")]
names = [k for k in names if not k.startswith("encoder.layers.")] + [k.replace("layers.0.", f"layers.{l}.", 1) for l in range(1) for k in layer0] + [k.replace("layers.1.", f"layers.{l}.", 1) for l in range(1, L) for k in layer1]
for name in names:
    src = name if not name.startswith("encoder.layers.") else "encoder.layers.1." + name.split(".", 3)[3]
    shape = dims(name, hdr[src]["shape"])
    count = math.prod(shape)
    if name == "temperature":
        f.seek(base + hdr[src]["data_offsets"][0]); data = array.array("f"); data.frombytes(f.read(4 * count))
    elif len(shape) == 1 or "norm" in name and len(shape) == 1:
        data = array.array("f", [1.0 if name.endswith(".weight") else 0.0]) * count
    elif name.startswith("encoder."):
        std = 0.02 / (math.sqrt(2 * L) if name.endswith("Wo.weight") else 1.0)
        g = rng.gauss
        data = array.array("f", (max(-2 * std, min(2 * std, g(0, std))) for _ in range(count)))
    elif name.startswith("type_emb"):
        data = array.array("f", (rng.gauss(0, 1) for _ in range(count)))
    else:
        b = 1 / math.sqrt(shape[-1]); u = rng.uniform
        data = array.array("f", (u(-b, b) for _ in range(count)))
    tensors[name] = (shape, data.tobytes())
meta, off = {}, 0
for k, (shape, b) in tensors.items():
    meta[k] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}; off += len(b)
h = json.dumps(meta).encode(); h += b" " * ((8 - len(h) % 8) % 8)
with open(out + "/model.safetensors", "wb") as o:
    o.write(struct.pack("<Q", len(h))); o.write(h)
    for k, (shape, b) in tensors.items(): o.write(b)
print("wrote", out, sum(math.prod(s) for s, _ in tensors.values()), "parameters")
