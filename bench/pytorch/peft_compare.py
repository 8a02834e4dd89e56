"""PyTorch + PEFT reference for memfit's GPU comparison (the only Python in memfit: the reference side).

Runs one training configuration per process, so that torch.cuda.max_memory_allocated belongs to it alone:

    python3 bench/pytorch/peft_compare.py --model vit-b16 --method lora-qv  --variant plain --batch 64
    python3 bench/pytorch/peft_compare.py --model vit-b16 --method lora-all --variant approx-act+ms-norm --batch 64
    python3 bench/pytorch/peft_compare.py --model llama-7b --method qlora --variant plain --batch 4 --seq 512
    python3 bench/pytorch/peft_compare.py --model llama-1b --method lora-all --dtype float32 --variant grad-ckpt --batch 2

Models are built from memfit's presets (vit-b16: ViT-B/16 at 224 with 10 labels; llama-1b: TinyLlama-1.1B shapes;
llama-7b: LLaMA-2-7B shapes) with random weights, as `finetune bench grid --sizes gpu` builds them. Methods:
lora-qv (LoRA r=8, alpha=16 on q and v), lora-all (every linear layer of the blocks), qlora (NF4 base weights with
double quantisation through bitsandbytes, LoRA on every linear layer). Compute (--dtype): bfloat16, the default,
is bfloat16 autocast over bfloat16 frozen weights, float32 adapters and AdamW state (PEFT's default adapter dtype),
as memfit's --compute-dtype bfloat16; float32 is float32 weights and no autocast, as memfit's float32. Attention:
"sdpa" (PyTorch's fused kernels: flash or memory-efficient) or "eager".

Variants: plain (PEFT as is), grad-ckpt (transformers' gradient checkpointing of every block, with PEFT's input
gradients enabled) or approx-act+ms-norm, the Approx-BP method written here as plain torch.autograd.Functions (the
paper's CUDA extension is not needed):
  * ReGELU2 / ReSiLU2: exact GELU/SiLU forward; the backward keeps only 2-bit codes of the input, packed four to a
    byte, and multiplies the incoming gradient by the step slope of each code.
  * MS-LN / MS-RMSNorm: the norm's output before its affine is what the norm's backward keeps, and the affine is
    folded into the following linear layers (W' = W diag(gamma), b' = b + W beta), so the linear layer keeps the
    very same tensor. With the random initialisation used here gamma = 1 and beta = 0 (the fold is exact); folding
    into a 4-bit layer would need re-quantisation and is refused.

One step = forward, loss (cross-entropy), backward and the AdamW update. Prints one JSON object: the peak of
torch.cuda.max_memory_allocated over the timed steps (after two warm-up steps, statistics reset) and the median
step time with throughput, and writes it to --json if given.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# memfit's approxbp.ReGELU2Coefficients / ReSiLU2Coefficients (the paper's published values).
REGELU2 = dict(A=[-0.04922261145617846, 1.0979632065417297, -0.048740595085551286],
               C=[-3.1858810036855245, -0.001178821281161997, 3.190832613414926])
RESILU2 = dict(A=[-0.04060357190528599, 1.080925428529668, -0.040321856624382146],
               C=[-6.3050461001646445, -0.0008684942046214787, 6.325815242089708])

VIT_B16 = dict(hidden=768, layers=12, heads=12, mlp=3072, image=224, patch=16, labels=10)
LLAMA = {
    "llama-1b": dict(vocab=32000, hidden=2048, mlp=5632, layers=22, heads=32, kv=4, eps=1e-5),
    "llama-7b": dict(vocab=32000, hidden=4096, mlp=11008, layers=32, heads=32, kv=32, eps=1e-5),
}


def levels(coeffs):
    """Slope of each 2-bit code: 0, A0, A0+A1, A0+A1+A2."""
    out, s = [0.0], 0.0
    for a in coeffs["A"]:
        s += a
        out.append(s)
    return out


def pack2(codes):
    """Packs uint8 codes (< 4) four to a byte; returns the bytes and the element count."""
    flat = codes.reshape(-1)
    n = flat.numel()
    pad = (-n) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    q = flat.view(-1, 4)
    return q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6), n


def unpack2(packed, n):
    parts = [(packed >> s) & 3 for s in (0, 2, 4, 6)]
    return torch.stack(parts, dim=1).reshape(-1)[:n]


class _ReAct2(torch.autograd.Function):
    """Exact activation forward; 2-bit step derivative backward (keeps 2 bits per element)."""

    @staticmethod
    def forward(ctx, x, kind):
        coeffs = REGELU2 if kind == "gelu" else RESILU2
        y = F.gelu(x) if kind == "gelu" else F.silu(x)
        bounds = torch.tensor(coeffs["C"], device=x.device, dtype=x.dtype)
        codes = torch.bucketize(x, bounds, right=False).to(torch.uint8)  # #{C_i < x}
        packed, n = pack2(codes)
        ctx.save_for_backward(packed)
        ctx.n, ctx.shape, ctx.kind = n, x.shape, kind
        return y

    @staticmethod
    def backward(ctx, gy):
        (packed,) = ctx.saved_tensors
        coeffs = REGELU2 if ctx.kind == "gelu" else RESILU2
        table = torch.tensor(levels(coeffs), device=gy.device, dtype=gy.dtype)
        slope = table[unpack2(packed, ctx.n).long()].reshape(ctx.shape)
        return gy * slope, None


class ReGELU2(nn.Module):
    def forward(self, x):
        return _ReAct2.apply(x, "gelu")


class ReSiLU2(nn.Module):
    def forward(self, x):
        return _ReAct2.apply(x, "silu")


class _MSNorm(torch.autograd.Function):
    """LayerNorm (rms=False) or RMSNorm (rms=True) without affine; keeps only its output and 1/std per row.

    Backward, with y the normalised output, r = 1/std and g the incoming gradient (d the row width):
      LayerNorm: dx = r * (g - mean(g) - y * mean(g * y))
      RMSNorm:   dx = r * (g - y * mean(g * y))
    """

    @staticmethod
    def forward(ctx, x, eps, rms):
        xf = x if x.dtype == torch.float64 else x.float()  # statistics in float32 at least
        if rms:
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            y = xf * r
        else:
            mu = xf.mean(-1, keepdim=True)
            r = torch.rsqrt((xf - mu).pow(2).mean(-1, keepdim=True) + eps)
            y = (xf - mu) * r
        y = y.to(torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled() else x.dtype)
        ctx.save_for_backward(y, r)
        ctx.rms = rms
        return y

    @staticmethod
    def backward(ctx, g):
        y, r = ctx.saved_tensors
        gf, yf = (g, y) if g.dtype == torch.float64 else (g.float(), y.float())
        inner = (gf * yf).mean(-1, keepdim=True)
        if ctx.rms:
            dx = r * (gf - yf * inner)
        else:
            dx = r * (gf - gf.mean(-1, keepdim=True) - yf * inner)
        return dx.to(g.dtype), None, None


class MSNorm(nn.Module):
    def __init__(self, eps, rms):
        super().__init__()
        self.eps, self.rms = eps, rms

    def forward(self, x):
        return _MSNorm.apply(x, self.eps, self.rms)


def fold_affine(norm, linears):
    """Folds norm's gamma (and beta) into the linear layers that read its output; returns the plain norm."""
    gamma = norm.weight.detach().float()
    beta = norm.bias.detach().float() if getattr(norm, "bias", None) is not None else None
    for lin in linears:
        base = getattr(lin, "base_layer", lin)  # a PEFT LoRA layer wraps the frozen one
        if not isinstance(base, nn.Linear) or base.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            if torch.all(gamma == 1) and (beta is None or torch.all(beta == 0)):
                continue  # nothing to fold
            sys.exit("folding a norm into a quantised layer needs re-quantisation; not supported here")
        with torch.no_grad():
            w = base.weight.float()
            if beta is not None:
                shift = w @ beta
                if base.bias is None:
                    base.bias = nn.Parameter(shift.to(base.weight.dtype), requires_grad=False)
                else:
                    base.bias.add_(shift.to(base.bias.dtype))
            base.weight.copy_((w * gamma).to(base.weight.dtype))
            for a in getattr(lin, "lora_A", {}).values():
                a.weight.mul_(gamma.to(a.weight.dtype))
    eps = getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", 1e-5)
    return MSNorm(eps, rms=not hasattr(norm, "bias"))


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build_vit(args):
    from transformers import ViTConfig, ViTForImageClassification
    c = VIT_B16
    cfg = ViTConfig(image_size=c["image"], patch_size=c["patch"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                    num_attention_heads=c["heads"], intermediate_size=c["mlp"], num_labels=c["labels"],
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation=args.attention)
    model = ViTForImageClassification(cfg).to("cuda", dtype=DTYPES[args.dtype])
    if hasattr(model.vit, "layers"):  # transformers 5: vit.layers.N.attention.{q,k,v,o}_proj, mlp.fc1/fc2
        targets = ["q_proj", "v_proj"] if args.method == "lora-qv" else ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]
    else:  # transformers 4: vit.encoder.layer.N.attention.attention.{query,key,value}, *.dense
        targets = ["query", "value"] if args.method == "lora-qv" else ["query", "key", "value", "dense"]
    return model, targets, ["classifier"]


def build_llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    c = LLAMA[args.model]
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["mlp"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv"],
                      rms_norm_eps=c["eps"], max_position_embeddings=4096, attn_implementation=args.attention,
                      tie_word_embeddings=False)
    torch.set_default_dtype(DTYPES[args.dtype])
    with torch.device("cuda"):  # transformers' own initialisation, on the GPU (norm weights 1)
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    if args.method == "qlora":
        import bitsandbytes as bnb
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name in names:
                    lin = getattr(parent, name, None)
                    if not isinstance(lin, nn.Linear):
                        continue
                    q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                          compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                          device="meta")
                    q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=True,
                                                 quant_type="nf4")
                    q = q.to("cuda")  # quantises (bitsandbytes quantises a Linear4bit when it moves to the GPU)
                    setattr(parent, name, q)
                    del lin
        torch.cuda.empty_cache()
    targets = ["q_proj", "v_proj"] if args.method == "lora-qv" else names
    return model, targets, []


def apply_approx(model, args):
    """Replaces the activations with ReGELU2/ReSiLU2 and the norms with MS-LN/MS-RMSNorm (affine folded)."""
    if args.model == "vit-b16":
        vit = model.base_model.model.vit if hasattr(model, "base_model") else model.vit
        if hasattr(vit, "layers"):  # transformers 5 names
            for layer in vit.layers:
                layer.mlp.activation_fn = ReGELU2()
                att = layer.attention
                layer.layernorm_before = fold_affine(layer.layernorm_before, [att.q_proj, att.k_proj, att.v_proj])
                layer.layernorm_after = fold_affine(layer.layernorm_after, [layer.mlp.fc1])
        for layer in getattr(getattr(vit, "encoder", None), "layer", []):  # transformers 4 names
            layer.intermediate.intermediate_act_fn = ReGELU2()
            att = layer.attention.attention
            layer.layernorm_before = fold_affine(layer.layernorm_before, [att.query, att.key, att.value])
            layer.layernorm_after = fold_affine(layer.layernorm_after, [layer.intermediate.dense])
        head = model.base_model.model.classifier if hasattr(model, "base_model") else model.classifier
        if hasattr(head, "modules_to_save"):  # PEFT's trainable copy of the head
            head = head.modules_to_save["default"]
        vit.layernorm = fold_affine(vit.layernorm, [head])
    else:
        inner = model.base_model.model.model if hasattr(model, "base_model") else model.model
        outer = model.base_model.model if hasattr(model, "base_model") else model
        for layer in inner.layers:
            mlp = layer.mlp
            mlp.act_fn = ReSiLU2()
            att = layer.self_attn
            layer.input_layernorm = fold_affine(layer.input_layernorm, [att.q_proj, att.k_proj, att.v_proj])
            layer.post_attention_layernorm = fold_affine(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])
        inner.norm = fold_affine(inner.norm, [outer.lm_head])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["vit-b16", "llama-1b", "llama-7b"], required=True)
    p.add_argument("--method", choices=["lora-qv", "lora-all", "qlora"], required=True)
    p.add_argument("--variant", choices=["plain", "approx-act+ms-norm", "grad-ckpt"], default="plain")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.method == "qlora" and args.model == "vit-b16":
        sys.exit("qlora here is for the LLaMA models (memfit's grid runs ViT QLoRA on its own)")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    is_vit = args.model == "vit-b16"
    model, targets, to_save = build_vit(args) if is_vit else build_llama(args)
    for q in model.parameters():
        q.requires_grad_(False)
    lcfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=targets,
                      modules_to_save=to_save or None, bias="none")
    model = get_peft_model(model, lcfg)
    if args.variant == "approx-act+ms-norm":
        apply_approx(model, args)
    elif args.variant == "grad-ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)

    if is_vit:
        c = VIT_B16
        x = torch.randn(args.batch, 3, c["image"], c["image"], device="cuda", dtype=DTYPES[args.dtype])
        y = torch.randint(0, c["labels"], (args.batch,), device="cuda")
        per_step, unit = args.batch, "images/s"
    else:
        c = LLAMA[args.model]
        ids = torch.randint(0, c["vocab"], (args.batch, args.seq), device="cuda")
        per_step, unit = args.batch * args.seq, "tokens/s"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            if is_vit:
                loss = F.cross_entropy(model(pixel_values=x).logits.float(), y)
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    out = dict(model=args.model, method=args.method, variant=args.variant, batch=args.batch,
               seq=None if is_vit else args.seq, attention=args.attention, compute="bfloat16 autocast" if args.dtype == "bfloat16" else "float32",
               peak_bytes=torch.cuda.max_memory_allocated(), peak_method="torch.cuda.max_memory_allocated",
               step_seconds=med, per_second=per_step / med, unit=unit, loss=float(loss),
               trainable_params=sum(q.numel() for q in trainable), steps=args.steps,
               torch=torch.__version__, device=torch.cuda.get_device_name())
    try:
        import peft
        import transformers
        out["peft"], out["transformers"] = peft.__version__, transformers.__version__
    except ImportError:
        pass
    text = json.dumps(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if not math.isfinite(out["loss"]):
        sys.exit("loss is not finite")


if __name__ == "__main__":
    main()
