"""Plain-PyTorch greedy decoding with a key/value cache: the reference side of `finetune bench generate`.

    python3 bench/pytorch/generate_compare.py --spec SPEC.json --json OUT.json

The spec names a LLaMA checkpoint folder (transformers' LlamaForCausalLM layout), the prompts (token ids, every
row the same length: no padding), the number of new tokens and the timed repetitions. The model is cpu_compare.py's
plain-torch LLaMA (RMSNorm, rotary embeddings as transformers computes them, grouped-query attention, SwiGLU, tied
embeddings), loaded from that very checkpoint; decoding is what transformers' generate does with its dynamic
cache: a prefill over the prompts, then one token per step, each layer's keys and values concatenated onto its
cache, the next token the argmax of the last logits. float32, torch.no_grad(), torch.set_num_threads(every core),
with cpu_compare's two fixes of Debian's torch + OpenBLAS pairing (named in the output).

Writes one JSON object: the generated ids of the last run (memfit checks they equal its own), the prefill and
decode seconds of each timed run (after one untimed warm-up run), decode tokens/s (rows x decode steps / seconds,
median over the runs), versions.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_compare as ref  # noqa: E402  (sets OPENBLAS_CORETYPE / OMP_WAIT_POLICY before torch loads)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "llama":
        sys.exit(f"{folder}: model type {c.get('model_type')}, the reference decodes LLaMA only")
    model = ref.Llama(c, None)
    ckpt = ref.read_checkpoint(folder)
    if model.tied:
        ckpt.pop("lm_head.weight", None)
    model.load_state_dict(ckpt, strict=True)
    model.eval()
    return model


def layer_step(layer, x, cos, sin, cache):
    """One decoder layer on the new tokens x [B, T, D] at the rotary angles cos, sin [T, Dh], appending their
    keys and values to cache (a [k, v] pair of [B, Hkv, t, Dh], or None) and attending to all of it."""
    b, t, _ = x.shape
    a = layer.self_attn
    y = layer.input_layernorm(x)
    q = a.q_proj(y).view(b, t, layer.heads, layer.dh).transpose(1, 2)
    k = a.k_proj(y).view(b, t, layer.kv, layer.dh).transpose(1, 2)
    v = a.v_proj(y).view(b, t, layer.kv, layer.dh).transpose(1, 2)
    q, k = q * cos + ref.rotate_half(q) * sin, k * cos + ref.rotate_half(k) * sin
    if cache is not None:
        k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
    new_cache = [k, v]
    rep = layer.heads // layer.kv
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(layer.dh)
    if t > 1:  # prefill: causal within the new tokens (the cache is empty then)
        s = s + torch.full((t, t), float("-inf")).triu(1)
    ctx = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, layer.heads * layer.dh)
    x = x + a.o_proj(ctx)
    y = layer.post_attention_layernorm(x)
    return x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(y)) * layer.mlp.up_proj(y)), new_cache


def forward(model, ids, start, caches):
    """Logits of the last new token [B, vocab] for ids [B, T] at positions start..start+T-1."""
    t = ids.shape[1]
    freqs = torch.outer(torch.arange(start, start + t, dtype=torch.float32), model.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = model.model.embed_tokens(ids)
    for i, layer in enumerate(model.model.layers):
        x, caches[i] = layer_step(layer, x, cos, sin, caches[i])
    x = model.model.norm(x[:, -1])
    return F.linear(x, model.model.embed_tokens.weight) if model.tied else model.lm_head(x)


def generate(model, prompts, new_tokens):
    ids = torch.tensor(prompts, dtype=torch.int64)
    caches = [None] * len(model.model.layers)
    t0 = time.perf_counter()
    nxt = forward(model, ids, 0, caches).argmax(-1)
    t1 = time.perf_counter()
    out = [nxt]
    pos = ids.shape[1]
    for _ in range(new_tokens - 1):
        nxt = forward(model, nxt[:, None], pos, caches).argmax(-1)
        out.append(nxt)
        pos += 1
    t2 = time.perf_counter()
    return torch.stack(out, dim=1).tolist(), t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    prompts, n = spec["prompts"], spec["new_tokens"]
    if len({len(p) for p in prompts}) != 1:
        sys.exit("the reference takes prompts of one length (no padding)")
    torch.set_num_threads(args.threads)
    model = load(spec["model"])
    prefill, decode = [], []
    with torch.no_grad():
        generate(model, prompts, min(n, 8))  # warm-up
        for _ in range(spec["runs"]):
            tokens, p, d = generate(model, prompts, n)
            prefill.append(p)
            decode.append(d)
    med = statistics.median(decode)
    result = dict(side="pytorch", tokens=tokens, prefill_seconds=prefill, decode_seconds=decode,
                  decode_tokens_per_second=len(prompts) * (n - 1) / med if med > 0 else 0,
                  threads=torch.get_num_threads(),
                  versions=dict(torch=torch.__version__, python=platform.python_version(), blas=ref.blas_info(),
                                notes="; ".join(ref.NOTES)))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(dict(decode_tokens_per_second=result["decode_tokens_per_second"])))


if __name__ == "__main__":
    main()
