#!/usr/bin/env python3
"""An independent reference for 06_llama: the Hugging Face Llama/Qwen2/Mistral
forward pass written from the transformers formulas (rotate_half with
concatenated cos/sin, repeat_kv, RMSNorm in float, llama3 rope scaling,
sliding windows per layer) in
plain Python double precision, reading the safetensors file with nothing but
the standard library. It runs 06_llama (--no-cache and cached, --dump-logits)
on the same checkpoint and prompt, and checks every step's logits and the
greedy ids against its own.

usage: hf_reference.py EXE MODEL_DIR PROMPT_IDS STEPS [extra 06_llama args...]
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = blob[base + begin:base + end]
        if e["dtype"] == "F32":
            values = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif e["dtype"] == "F16":
            values = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        elif e["dtype"] == "BF16":
            halves = struct.unpack("<%dH" % (len(raw) // 2), raw)
            values = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
        else:
            raise SystemExit("unsupported dtype " + e["dtype"])
        tensors[name] = (e["shape"], values)
    return tensors


def matrix(tensors, name):
    shape, values = tensors[name]
    rows, cols = shape
    return [values[r * cols:(r + 1) * cols] for r in range(rows)]


def linear(x, w, b=None):
    out = [sum(xi * wi for xi, wi in zip(x, row)) for row in w]
    if b is not None:
        out = [o + bi for o, bi in zip(out, b)]
    return out


def rms_norm(x, weight, eps):
    variance = sum(v * v for v in x) / len(x)
    scale = 1.0 / math.sqrt(variance + eps)
    return [w * (v * scale) for v, w in zip(x, weight)]


def rope_settings(cfg, layer_type):
    """(theta, scaling dict or None) for one layer, the way transformers reads a config: an old-style
    rope_scaling object takes the place of rope_parameters, a top-level rope_theta is only the default
    for a rope_parameters object without one, and rope_parameters may hold one object per layer type."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (None if kind == "default" else dict(params, rope_type=kind))


def inv_frequencies(cfg, dim, layer_type="full_attention"):
    theta, scaling = rope_settings(cfg, layer_type)
    inv = [1.0 / (theta ** (i / dim)) for i in range(0, dim, 2)]
    if scaling:
        kind = scaling["rope_type"]
        if kind == "linear":
            inv = [f / scaling["factor"] for f in inv]
        elif kind == "llama3":
            factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
            old = scaling.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
            low_wavelen, high_wavelen = old / low, old / high
            out = []
            for f in inv:
                wavelen = 2 * math.pi / f
                scaled = f / factor if wavelen > low_wavelen else f
                if not (wavelen < high_wavelen) and not (wavelen > low_wavelen):
                    smooth = (old / wavelen - low) / (high - low)
                    scaled = (1 - smooth) * scaled / factor + smooth * scaled
                out.append(scaled)
            inv = out
        else:
            raise SystemExit("the reference has no rope_type " + kind)
    return inv


def rotate(x, position, inv):
    half = len(x) // 2
    freqs = [position * f for f in inv]
    emb = freqs + freqs
    rotated_half = [-v for v in x[half:]] + x[:half]
    return [xi * math.cos(e) + ri * math.sin(e) for xi, ri, e in zip(x, rotated_half, emb)]


def layer_windows(cfg):
    """Per layer, the number of recent keys a query attends to (0: all), by transformers' rules:
    Mistral windows every layer when sliding_window is set; Qwen2 only when use_sliding_window is
    true, and then the layers layer_types calls "sliding_attention", or without layer_types the
    layers from max_window_layers on."""
    layers = cfg["num_hidden_layers"]
    if cfg["model_type"] == "mistral":
        return [cfg.get("sliding_window") or 0] * layers
    if cfg["model_type"] != "qwen2" or not cfg.get("use_sliding_window", False):
        return [0] * layers
    size = cfg.get("sliding_window") or 0
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if size and i >= cfg.get("max_window_layers", 28) else "full_attention"
                 for i in range(layers)]
    return [size if kind == "sliding_attention" else 0 for kind in types]


def forward_last_logits(cfg, t, ids, windows):
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    dim = cfg.get("head_dim") or hidden // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    qwen2 = cfg["model_type"] == "qwen2"
    bias = qwen2 or cfg.get("attention_bias", False)
    out_bias = (not qwen2) and cfg.get("attention_bias", False)
    inv = inv_frequencies(cfg, dim)
    embed = matrix(t, "model.embed_tokens.weight")
    x = [list(embed[i]) for i in ids]
    n = len(ids)
    for layer in range(cfg["num_hidden_layers"]):
        window = windows[layer]
        p = "model.layers.%d." % layer
        g = lambda name: t[p + name][1]
        m = lambda name: matrix(t, p + name)
        h = [rms_norm(row, g("input_layernorm.weight"), eps) for row in x]
        q = [linear(r, m("self_attn.q_proj.weight"), g("self_attn.q_proj.bias") if bias else None) for r in h]
        k = [linear(r, m("self_attn.k_proj.weight"), g("self_attn.k_proj.bias") if bias else None) for r in h]
        v = [linear(r, m("self_attn.v_proj.weight"), g("self_attn.v_proj.bias") if bias else None) for r in h]
        q = [[rotate(q[i][a * dim:(a + 1) * dim], i, inv) for a in range(heads)] for i in range(n)]
        k = [[rotate(k[i][a * dim:(a + 1) * dim], i, inv) for a in range(kv_heads)] for i in range(n)]
        v = [[v[i][a * dim:(a + 1) * dim] for a in range(kv_heads)] for i in range(n)]
        rep = heads // kv_heads
        attn = []
        for i in range(n):
            row = []
            for a in range(heads):
                kv = a // rep  # repeat_kv: query head a reads KV head a // n_rep
                visible = [j for j in range(i + 1) if window <= 0 or j > i - window]
                scores = [sum(qa * kb for qa, kb in zip(q[i][a], k[j][kv])) / math.sqrt(dim) for j in visible]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                row += [sum(w * v[j][kv][d] for w, j in zip(weights, visible)) / total for d in range(dim)]
            attn.append(row)
        o = [linear(r, m("self_attn.o_proj.weight"), g("self_attn.o_proj.bias") if out_bias else None) for r in attn]
        x = [[a + b for a, b in zip(xr, orow)] for xr, orow in zip(x, o)]
        h = [rms_norm(row, g("post_attention_layernorm.weight"), eps) for row in x]
        gate = [linear(r, m("mlp.gate_proj.weight")) for r in h]
        up = [linear(r, m("mlp.up_proj.weight")) for r in h]
        act = [[gv / (1 + math.exp(-gv)) * uv for gv, uv in zip(gr, ur)] for gr, ur in zip(gate, up)]
        down = [linear(r, m("mlp.down_proj.weight")) for r in act]
        x = [[a + b for a, b in zip(xr, dr)] for xr, dr in zip(x, down)]
    last = rms_norm(x[-1], t["model.norm.weight"][1], eps)
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", False) else "lm_head.weight"
    return linear(last, matrix(t, head))


def read_dump(path):
    with open(path, "rb") as f:
        fields = {}
        while True:
            line = f.readline().decode().strip()
            if line == "end_header":
                break
            key, _, value = line.partition(" ")
            fields[key] = value
        steps, vocab = int(fields["steps"]), int(fields["vocab_size"])
        values = struct.unpack("<%df" % (steps * vocab), f.read())
    return [list(values[s * vocab:(s + 1) * vocab]) for s in range(steps)]


def main():
    exe, model, prompt_text, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = sys.argv[5:]
    cfg = json.load(open(os.path.join(model, "config.json")))
    tensors = read_safetensors(os.path.join(model, "model.safetensors"))
    windows = layer_windows(cfg)
    ids = [int(v) for v in prompt_text.split(",")]
    reference, generated = [], []
    for _ in range(steps):
        logits = forward_last_logits(cfg, tensors, ids + generated, windows)
        reference.append(logits)
        generated.append(max(range(len(logits)), key=lambda i: (logits[i], -i)))
    worst_all = 0.0
    ok = True
    for mode in (["--no-cache"], []):
        with tempfile.TemporaryDirectory() as tmp:
            dump = os.path.join(tmp, "logits.bin")
            run = subprocess.run([exe, "--model", model, "--prompt-ids", prompt_text, "--max-new-tokens", str(steps),
                                  "--dump-logits", dump] + mode + extra, capture_output=True, text=True)
            if run.returncode != 0:
                print(run.stdout + run.stderr)
                raise SystemExit("06_llama failed")
            got = read_dump(dump)
            ids_line = [l for l in run.stdout.splitlines() if l.startswith("generated ids:")][0]
            got_ids = [int(v) for v in ids_line.split(":")[1].split()]
        worst = max(abs(a - b) for gs, rs in zip(got, reference) for a, b in zip(gs, rs))
        scale = max(abs(v) for rs in reference for v in rs)
        name = "recompute" if mode else "cached"
        same = got_ids == generated
        print("%s: ids %s the reference's, largest logit difference %.3g (logits up to %.3g)"
              % (name, "equal" if same else "DIFFER FROM", worst, scale))
        ok = ok and same and len(got) == steps and worst <= 1e-4 * max(1.0, scale)
        worst_all = max(worst_all, worst)
    print("reference ids: " + " ".join(str(i) for i in generated))
    print("matches the reference: " + ("yes" if ok else "no"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
