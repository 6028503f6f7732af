#!/usr/bin/env python3
"""Trains the small byte-level Llama-architecture model shipped in models/ (see
docs/model-card.md): English prose from the Debian package debian-handbook plus a
seeded multi-query associative-recall task, on the CPU with one thread.

Writes, into --out: model.safetensors (F16), config.json (Hugging Face
LlamaForCausalLM fields), heldout_sample.txt (held-out prose the C++ tests read),
recall_set.json (a seeded recall set with answers) and results.json (the figures
PyTorch computed at the end of training on the shipped F16 weights).

Development-time only: the engine, its tests and CI never need PyTorch.

usage: train.py --out models/handbook-byte-llama [--steps N] [--seed S]
"""
import argparse
import glob
import hashlib
import html.parser
import json
import math
import os
import random
import re
import struct
import time

import torch
import torch.nn.functional as F

HANDBOOK_PACKAGE = "debian-handbook"
HANDBOOK_HTML = "/usr/share/doc/debian-handbook/html/en-US"

BOS = 256  # begins every sequence, prose or recall
EOS = 257  # unused in training; reserved so the vocabulary has room for an end marker
VOCAB = 258

CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
)
CONTEXT = CONFIG["max_position_embeddings"]  # tokens per training sequence, BOS included


# ---------------------------------------------------------------- corpus


class _text_of_html(html.parser.HTMLParser):
    """Visible text of one handbook page, block elements on their own lines."""

    BLOCKS = {"p", "div", "br", "li", "h1", "h2", "h3", "h4", "pre", "tr", "dt", "dd", "table"}
    HIDDEN = {"script", "style", "head"}

    def __init__(self):
        super().__init__()
        self.parts = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.HIDDEN:
            self.hidden += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.HIDDEN:
            self.hidden -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


# Navigation lines every page repeats; they are not prose.
_NAVIGATION = {"Download the ebook", "Prev", "Next", "The Debian Administrator's Handbook", "Home", "Up"}


def page_text(path):
    parser = _text_of_html()
    with open(path, encoding="utf-8") as f:
        parser.feed(f.read())
    lines = []
    for line in "".join(parser.parts).split("\n"):
        line = re.sub(r"\s+", " ", line).strip()
        if line in _NAVIGATION:
            continue
        lines.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text + "\n"


def load_corpus():
    """(name, bytes) of every English page except the table of contents, sorted by name."""
    pages = sorted(glob.glob(os.path.join(HANDBOOK_HTML, "*.html")))
    if not pages:
        raise SystemExit(f"no pages under {HANDBOOK_HTML}: apt-get install {HANDBOOK_PACKAGE}")
    docs = []
    for p in pages:
        name = os.path.basename(p)
        if name == "index.html":
            continue
        docs.append((name, page_text(p).encode("utf-8")))
    return docs


def split_documents(docs):
    """Every tenth page (in name order, starting with the fifth) is held out: training never
    sees it. Split by page, so no held-out paragraph has a training neighbour."""
    train = [d for i, d in enumerate(docs) if i % 10 != 4]
    held = [d for i, d in enumerate(docs) if i % 10 == 4]
    return train, held


# ---------------------------------------------------------------- recall task

KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VALUE_LETTERS = "abcdefghijklmnopqrstuvwxyz"


MIN_PAIRS, MAX_PAIRS = 4, 16


RECALL_FORMATS = ("equals", "adjacent")


def recall_sequence(rng, max_len=CONTEXT - 1, max_pairs=MAX_PAIRS, style="equals"):
    """One multi-query associative-recall text and the byte spans of its answers.

    style 'equals': 'recall: K=wd H=ma ... ? H=ma K=wd ...\n'; style 'adjacent':
    'recall: Kwd Hma ... ? Hma Kwd ...\n'. Pairs of one-letter upper-case keys (distinct
    within the text) and two-letter lower-case values, then queries for some of the keys in
    random order; the answer to a query is the value given earlier for its key. In 'equals'
    the first answer byte follows '=', so finding it takes two hops (the '=' whose previous
    byte is the key, then the byte after it); in 'adjacent' it follows the key itself, the
    one-hop copy an induction head makes (the byte after the earlier occurrence of the
    current byte). Returns (text, [(first_byte, length), ...]) with spans into text. A
    curriculum may lower max_pairs (fewer pairs are fewer distractors); the evaluation set
    uses 4 to 16."""
    pairs = rng.randint(min(MIN_PAIRS, max_pairs), max_pairs)
    keys = rng.sample(KEYS, pairs)
    values = {k: rng.choice(VALUE_LETTERS) + rng.choice(VALUE_LETTERS) for k in keys}
    separator = "=" if style == "equals" else ""
    text = "recall: " + " ".join(f"{k}{separator}{values[k]}" for k in keys) + " ?"
    queries = rng.sample(keys, rng.randint(max(1, pairs // 2), pairs))
    spans = []
    for k in queries:
        text += f" {k}{separator}"
        spans.append((len(text), 2))
        text += values[k]
    text += "\n"
    assert len(text) <= max_len
    return text, spans


# ---------------------------------------------------------------- model


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class llama(torch.nn.Module):
    """Llama as the engine runs it (Hugging Face formulas): RMSNorm, rotate-half RoPE,
    grouped-query attention (query head h reads KV head h // group), SwiGLU, tied output."""

    def __init__(self, c, seed):
        super().__init__()
        self.c = c
        g = torch.Generator().manual_seed(seed)
        h, d = c["hidden_size"], c["head_dim"]
        qw, kvw, ffn = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, c["intermediate_size"]
        std, out_std = 0.02, 0.02 / math.sqrt(2 * c["num_hidden_layers"])

        def param(*shape, scale=std):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale)

        def ones(n):
            return torch.nn.Parameter(torch.ones(n))

        # Hugging Face tensor names; torch's parameter names cannot hold '.', so each is also
        # registered under the name with '_' for the optimiser.
        self.params = {}
        p = self.params
        p["model.embed_tokens.weight"] = param(VOCAB, h)
        for l in range(c["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            p[pre + "input_layernorm.weight"] = ones(h)
            p[pre + "self_attn.q_proj.weight"] = param(qw, h)
            p[pre + "self_attn.k_proj.weight"] = param(kvw, h)
            p[pre + "self_attn.v_proj.weight"] = param(kvw, h)
            p[pre + "self_attn.o_proj.weight"] = param(h, qw, scale=out_std)
            p[pre + "post_attention_layernorm.weight"] = ones(h)
            p[pre + "mlp.gate_proj.weight"] = param(ffn, h)
            p[pre + "mlp.up_proj.weight"] = param(ffn, h)
            p[pre + "mlp.down_proj.weight"] = param(h, ffn, scale=out_std)
        p["model.norm.weight"] = ones(h)
        for name, value in p.items():
            self.register_parameter(name.replace(".", "_"), value)
        half = d // 2
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(half, dtype=torch.float64) * 2 / d))
        angles = torch.arange(c["max_position_embeddings"], dtype=torch.float64)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, ids):
        c, p = self.c, self.params
        b, t = ids.shape
        nq, nkv, d, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        cos, sin = self.cos[:t], self.sin[:t]
        x = F.embedding(ids, p["model.embed_tokens.weight"])
        for l in range(c["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            n = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
            q = (n @ p[pre + "self_attn.q_proj.weight"].T).view(b, t, nq, d).transpose(1, 2)
            k = (n @ p[pre + "self_attn.k_proj.weight"].T).view(b, t, nkv, d).transpose(1, 2)
            v = (n @ p[pre + "self_attn.v_proj.weight"].T).view(b, t, nkv, d).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(nq // nkv, dim=1)
            v = v.repeat_interleave(nq // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(b, t, nq * d) @ p[pre + "self_attn.o_proj.weight"].T
            n = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
            gate = F.silu(n @ p[pre + "mlp.gate_proj.weight"].T)
            x = x + (gate * (n @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
        x = rms_norm(x, p["model.norm.weight"], eps)
        return x @ p["model.embed_tokens.weight"].T


# ---------------------------------------------------------------- batches


def text_window(rng, train_blob):
    start = rng.randrange(0, len(train_blob) - (CONTEXT - 1))
    return [BOS] + list(train_blob[start:start + CONTEXT - 1]), [1.0] * CONTEXT


def recall_window(rng, train_blob, answers_only, single, max_pairs, style):
    """Recall texts (each after its own BOS) to CONTEXT tokens, and a loss weight per token.
    Packed (single false): more recall texts fill the window, so a later text's keys also
    occur, with other values, in the texts before it. Single: one recall text, then prose
    from the training text fills the window, so a query's key occurs once before it, as in
    the evaluation. Weights: 1 for every token, as for prose, or with answers_only 1 for
    the answer bytes alone (the keys and values are random, so their loss is noise that only
    dilutes the one signal recall gives; the filling prose then has weight 0 too, so that
    the few answers of a window are not drowned by it)."""
    ids, weights = [], []
    while len(ids) < CONTEXT:
        if single and ids:
            prose, _ = text_window(rng, train_blob)
            ids += prose
            weights += [0.0 if answers_only else 1.0] * len(prose)
            break
        text, spans = recall_sequence(rng, max_pairs=max_pairs, style=style)
        w = [0.0 if answers_only else 1.0] * (len(text) + 1)
        for first, length in spans:
            for j in range(first, first + length):
                w[j + 1] = 1.0  # text byte j is token j + 1 after the BOS
        ids += [BOS] + list(text.encode("ascii"))
        weights += w
    return ids[:CONTEXT], weights[:CONTEXT]


def batch(rng, train_blob, size, recall_fraction, recall_answers_only=False, recall_single=False,
          max_pairs=MAX_PAIRS, style="equals"):
    rows = [recall_window(rng, train_blob, recall_answers_only, recall_single, max_pairs, style)
            if rng.random() < recall_fraction else text_window(rng, train_blob) for _ in range(size)]
    t = torch.tensor([ids for ids, _ in rows], dtype=torch.long)
    w = torch.tensor([weights for _, weights in rows], dtype=torch.float32)
    return t[:, :-1], t[:, 1:], w[:, 1:]


def recall_rows(rng, rows, max_pairs, style):
    """`rows` short rows of one recall text each (after its BOS), padded with EOS to the
    longest text of the step, with loss weight 1 on the answer bytes alone. Shorter than a
    CONTEXT window, so a step holds several times more recall texts for the same compute."""
    texts = [recall_sequence(rng, max_pairs=max_pairs, style=style) for _ in range(rows)]
    length = max(len(text) for text, _ in texts) + 1
    ids, weights = [], []
    for text, spans in texts:
        row = [BOS] + list(text.encode("ascii"))
        w = [0.0] * length
        for first, n in spans:
            for j in range(first, first + n):
                w[j + 1] = 1.0  # text byte j is token j + 1 after the BOS
        ids.append(row + [EOS] * (length - len(row)))  # padding after the text: causal, unseen
        weights.append(w)
    t = torch.tensor(ids, dtype=torch.long)
    w = torch.tensor(weights, dtype=torch.float32)
    return t[:, :-1], t[:, 1:], w[:, 1:]


# ---------------------------------------------------------------- evaluation


def heldout_windows(data, window=CONTEXT - 1):
    """Non-overlapping windows of `window` bytes, each scored after a BOS (a short tail is dropped)."""
    return [[BOS] + list(data[i:i + window]) for i in range(0, len(data) - window + 1, window)]


@torch.no_grad()
def window_nats(model, windows, chunk=32):
    """Per window: the summed negative log-likelihood (nats) of every token after the BOS."""
    out = []
    for i in range(0, len(windows), chunk):
        ids = torch.tensor(windows[i:i + chunk], dtype=torch.long)
        logits = model(ids[:, :-1]).double()
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").sum(dim=1)
        out += nll.tolist()
    return out


@torch.no_grad()
def recall_scores(model, items):
    """Per query: whether the greedy (argmax) prediction of every answer byte is right given
    the text before it, the smallest top-1 minus top-2 logit gap over its bytes, and the
    argmax token of each of its bytes; and the mean negative log-likelihood (nats) of an answer
    byte, which moves before the accuracy does (guessing among 26 letters is 3.26)."""
    correct, margins, predicted = [], [], []
    answer_nats, answer_bytes = 0.0, 0
    for text, spans in items:
        ids = torch.tensor([[BOS] + list(text.encode("ascii"))], dtype=torch.long)
        logits = model(ids[:, :-1])[0]
        log_probs = F.log_softmax(logits.double(), dim=-1)
        for first, length in spans:
            ok, margin, argmaxes = True, float("inf"), []
            for j in range(first, first + length):
                # The byte at text position j is token j + 1, predicted by the logits of row j.
                row = logits[j]
                answer_nats -= float(log_probs[j, ids[0, j + 1]])
                answer_bytes += 1
                top2 = torch.topk(row, 2)
                argmaxes.append(int(top2.indices[0]))
                ok = ok and argmaxes[-1] == int(ids[0, j + 1])
                margin = min(margin, float(top2.values[0] - top2.values[1]))
            correct.append(ok)
            margins.append(margin)
            predicted.append(argmaxes)
    return correct, margins, predicted, answer_nats / max(1, answer_bytes)


# ---------------------------------------------------------------- output


def write_safetensors(path, tensors):
    """F16 safetensors by hand: an 8-byte header length, the JSON header, the raw data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.float16).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """The tensors of a safetensors file write_safetensors wrote, as float32."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(blob[8 + n + begin:8 + n + end])
        tensors[name] = torch.frombuffer(raw, dtype=torch.float16).reshape(e["shape"]).float()
    return tensors


def hf_config():
    c = dict(CONFIG)
    c.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=VOCAB,
        hidden_act="silu",
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        torch_dtype="float16",
        initializer_range=0.02,
    )
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--recall-fraction", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--init-from", default=None,
                    help="warm start: a model.safetensors this script wrote (same architecture) instead of the "
                         "seeded random initialisation; its SHA-256 is recorded in results.json")
    ap.add_argument("--recall-loss", choices=("all", "answers"), default="all",
                    help="which tokens of a recall window the loss covers: all, or only the answer bytes")
    ap.add_argument("--recall-format", choices=RECALL_FORMATS, default="equals",
                    help="recall texts as 'K=wd' pairs (two hops to an answer) or 'Kwd' pairs (one hop); the "
                         "evaluation set uses the same format")
    ap.add_argument("--recall-window", choices=("packed", "single"), default="packed",
                    help="a recall training window: recall texts packed, or one recall text then prose")
    ap.add_argument("--recall-pairs-start", type=int, default=MAX_PAIRS,
                    help="curriculum: the most pairs a training recall text has at step 0 (1 to 16)")
    ap.add_argument("--curriculum-steps", type=int, default=0,
                    help="steps over which the most pairs rises from --recall-pairs-start to 16 (0: no curriculum)")
    ap.add_argument("--recall-rows", type=int, default=0,
                    help="each step also trains on this many short rows of one recall text each, answers only "
                         "(their mean loss added to the windows'); 0: none")
    ap.add_argument("--warmup", type=int, default=None, help="learning-rate warm-up steps (default steps // 30)")
    ap.add_argument("--evaluate-only", action="store_true",
                    help="no training: evaluate --out's model.safetensors and rewrite the evaluation files")
    ap.add_argument("--sample-bytes", type=int, default=255 * 128, help="held-out prose shipped for the C++ tests")
    ap.add_argument("--recall-eval", type=int, default=400, help="recall texts PyTorch scores")
    ap.add_argument("--recall-shipped", type=int, default=48, help="of those, the first N shipped for the C++ tests")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    docs = load_corpus()
    train_docs, held_docs = split_documents(docs)
    train_blob = b"\n".join(d for _, d in train_docs)
    held_blob = b"\n".join(d for _, d in held_docs)
    print(f"corpus: {len(docs)} pages, {sum(len(d) for _, d in docs)} bytes; train {len(train_docs)} pages "
          f"{len(train_blob)} bytes, held out {len(held_docs)} pages {len(held_blob)} bytes", flush=True)

    model = llama(CONFIG, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)
    decay = [p for n, p in model.params.items() if p.dim() == 2]
    no_decay = [p for n, p in model.params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 30)
    init_from = None
    if args.init_from and not args.evaluate_only:
        with open(args.init_from, "rb") as f:
            init_from = dict(file=args.init_from, sha256=hashlib.sha256(f.read()).hexdigest())
        with torch.no_grad():
            for name, value in read_safetensors(args.init_from).items():
                model.params[name].copy_(value)
        print(f"warm start from {args.init_from} (sha256 {init_from['sha256']})", flush=True)

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    rng = random.Random(args.seed)
    eval_rng = random.Random(args.seed + 1)  # the recall evaluation set: texts training draws independently
    recall_items = [recall_sequence(eval_rng, style=args.recall_format) for _ in range(args.recall_eval)]
    held_windows = heldout_windows(held_blob)
    probe = held_windows[:: max(1, len(held_windows) // 12)][:12]

    start = time.time()
    recall_row_tokens = 0
    log = []
    previous = None
    if args.evaluate_only:
        # Recompute the evaluation files and figures of the shipped weights; the training
        # record of the run that made them is kept.
        with open(os.path.join(args.out, "results.json")) as f:
            previous = json.load(f)
        log = previous["log"]
        with torch.no_grad():
            for name, value in read_safetensors(os.path.join(args.out, "model.safetensors")).items():
                model.params[name].copy_(value)
    for step in range(0 if args.evaluate_only else args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        # Curriculum: the most pairs a recall text may have rises linearly from
        # --recall-pairs-start to 16 over the first --curriculum-steps steps.
        max_pairs = MAX_PAIRS
        if args.curriculum_steps > 0 and step < args.curriculum_steps:
            start_pairs = args.recall_pairs_start
            max_pairs = start_pairs + int((MAX_PAIRS - start_pairs) * step / args.curriculum_steps)
        x, y, w = batch(rng, train_blob, args.batch, args.recall_fraction, args.recall_loss == "answers",
                        args.recall_window == "single", max_pairs, args.recall_format)
        logits = model(x)
        token_loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="none")
        loss = (token_loss * w.reshape(-1)).sum() / w.sum()
        if args.recall_rows > 0:
            # The two objectives weigh the same whatever their token counts: the mean over
            # the windows' tokens plus the mean over the recall rows' answer bytes.
            rx, ry, rw = recall_rows(rng, args.recall_rows, max_pairs, args.recall_format)
            recall_row_tokens += rx.numel()
            recall_loss = F.cross_entropy(model(rx).reshape(-1, VOCAB), ry.reshape(-1), reduction="none")
            loss = loss + (recall_loss * rw.reshape(-1)).sum() / rw.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            model.eval()
            probe_nats = window_nats(model, probe)
            held_bpb = sum(probe_nats) / (len(probe) * (CONTEXT - 1)) / math.log(2)
            correct, _, _, answer_nats = recall_scores(model, recall_items[:32])
            model.train()
            entry = dict(step=step, seconds=round(time.time() - start, 1), train_loss=round(loss.item(), 4),
                         heldout_probe_bits_per_byte=round(held_bpb, 4),
                         recall_probe_accuracy=round(sum(correct) / len(correct), 4),
                         recall_probe_answer_nats=round(answer_nats, 4))
            log.append(entry)
            print(json.dumps(entry), flush=True)
    train_seconds = previous["training"]["seconds"] if previous else time.time() - start

    # The figures are computed on the weights as shipped (rounded to F16, computed in float32),
    # so the C++ engine, which loads the same F16 file, is checked against exactly this model.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float16).to(torch.float32))
    model.eval()

    write_safetensors(os.path.join(args.out, "model.safetensors"), dict(model.params.items()))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf_config(), f, indent=2)
        f.write("\n")

    all_nats = window_nats(model, held_windows)
    sample = held_blob[: args.sample_bytes]
    sample_windows = heldout_windows(sample)
    sample_nats = window_nats(model, sample_windows)
    with open(os.path.join(args.out, "heldout_sample.txt"), "wb") as f:
        f.write(sample)

    correct, margins, predicted, answer_nats = recall_scores(model, recall_items)
    shipped = recall_items[: args.recall_shipped]
    shipped_queries = sum(len(s) for _, s in shipped)
    with open(os.path.join(args.out, "recall_set.json"), "w") as f:
        json.dump({
            "format": "each text is scored as the token ids [bos_token] + its UTF-8 bytes; an answer [first, length] "
                      "names bytes of the text; a query is right when the argmax prediction of each of its bytes, "
                      "given the text before it, is that byte",
            "bos_token": BOS,
            "items": [{"text": t, "answers": [list(s) for s in spans]} for t, spans in shipped],
        }, f, indent=1)
        f.write("\n")

    ln2 = math.log(2)
    results = {
        "computed_by": f"PyTorch {torch.__version__}, float32, on the F16 weights of model.safetensors",
        "training": previous["training"] if previous else dict(steps=args.steps, batch=args.batch, context=CONTEXT, lr=args.lr,
                         recall_fraction=args.recall_fraction, seed=args.seed, threads=args.threads,
                         warmup=warmup, init_from=init_from, recall_loss=args.recall_loss,
                         recall_window=args.recall_window, recall_format=args.recall_format, recall_pairs_start=args.recall_pairs_start,
                         curriculum_steps=args.curriculum_steps, recall_rows=args.recall_rows,
                         seconds=round(train_seconds, 1), tokens=args.steps * args.batch * (CONTEXT - 1) + recall_row_tokens,
                         final_train_loss=log[-1]["train_loss"]),
        "parameters": n_params,
        "corpus": dict(package=HANDBOOK_PACKAGE, pages=len(docs), train_pages=len(train_docs),
                       heldout_pages=len(held_docs), train_bytes=len(train_blob), heldout_bytes=len(held_blob),
                       heldout_page_names=[n for n, _ in held_docs]),
        "heldout": dict(window_bytes=CONTEXT - 1, windows=len(held_windows),
                        bits_per_byte=sum(all_nats) / (len(held_windows) * (CONTEXT - 1)) / ln2),
        "heldout_sample": dict(file="heldout_sample.txt", window_bytes=CONTEXT - 1, windows=len(sample_windows),
                               bits_per_byte=sum(sample_nats) / (len(sample_windows) * (CONTEXT - 1)) / ln2,
                               window_nats=sample_nats),
        "recall": dict(texts=len(recall_items), queries=len(correct), accuracy=sum(correct) / len(correct),
                       answer_nats_per_byte=answer_nats),
        "recall_set": dict(file="recall_set.json", texts=len(shipped), queries=shipped_queries,
                           accuracy=sum(correct[:shipped_queries]) / shipped_queries,
                           correct=correct[:shipped_queries],
                           margins=[round(m, 5) for m in margins[:shipped_queries]],
                           predicted=predicted[:shipped_queries]),
        "log": log,
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(json.dumps({k: results[k] for k in ("parameters", "heldout", "recall")}), flush=True)
    print(f"held-out sample {results['heldout_sample']['bits_per_byte']:.4f} bits/byte, recall set accuracy "
          f"{results['recall_set']['accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
