"""Plain-PyTorch CPU reference for memfit's side-by-side CPU benchmark (the only Python in memfit: the reference side).

`finetune bench cpu` (bench/cpu/compare.sh) writes a spec file per case and runs this script once per case, in its
own process, after memfit's runs of the same case:

    python3 bench/pytorch/cpu_compare.py --spec WORK/spec-a-vit-full.json --json OUT.json

The spec names the Hugging Face checkpoint folder memfit trains, the method (full or lora-all), the batch file that
memfit wrote (safetensors), the adapter-initialisation file memfit wrote (LoRA) and the training settings. The
model is written here as ordinary torch modules, with the parameter names of the Hugging Face checkpoint, and loads
that very checkpoint (safetensors parsed with plain Python and numpy: an 8-byte little-endian header length, a
JSON header, raw little-endian bytes):

  * ViT (transformers' ViTForImageClassification): convolutional patch embedding, CLS token, position embeddings,
    pre-LN blocks (q, k, v, softmax(q k^T / sqrt(d)) v, output projection; exact-erf GELU MLP), final LayerNorm,
    classifier on the CLS token; cross entropy.
  * LLaMA (transformers' LlamaForCausalLM): RMSNorm, rotary embeddings as transformers computes them,
    grouped-query causal attention, SwiGLU MLP, tied embeddings when the config says so; next-token cross entropy
    (logits at 0..T-2 against labels at 1..T-1, mean over the tokens).
  * RoBERTa (transformers' RobertaForMaskedLM): word + position + token-type embeddings (positions padding_idx + 1
    + the running count of non-pad tokens) and LayerNorm, post-LN blocks (attention, exact-erf GELU MLP), the LM
    head (dense, GELU, LayerNorm, decoder tied to the word embeddings plus lm_head.bias); masked-LM cross entropy
    (mean over the positions whose label is not -100). No dropout on either side.

LoRA (method lora-all): every linear layer but the head becomes a frozen Linear plus A [r, in] and B [out, r],
y = W x + b + (alpha / r) B A x, with A and B taken from memfit's initial adapters, so both sides start from the
same weights. Full fine-tuning trains every parameter. AdamW with the spec's hyper-parameters, float32,
torch.set_num_threads(os.cpu_count()). Before torch loads, the script fixes two things of Debian's torch +
OpenBLAS-pthread pairing that would otherwise make the reference needlessly slow, and says so in its output (a
caller's own OPENBLAS_CORETYPE or OMP_WAIT_POLICY is kept): OpenBLAS 0.3.21 falls back to its generic Prescott
kernels on CPUs it does not know (OPENBLAS_CORETYPE is then set to SkylakeX or Haswell), and libgomp's spinning
threads contend with OpenBLAS's (OMP_WAIT_POLICY=PASSIVE).

One step = zero_grad, forward, loss, backward, AdamW step. The first `warmup` steps are not timed; then `steps`
timed steps. Writes one JSON object (the fields of memfit's bench.CPUSideResult): every step's loss, the timed
step times and their median, throughput, the process's VmHWM before the first step and after the last one (its
maximum resident set size), versions (torch, numpy, BLAS and its threads).
"""
import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import sys
import time



def openblas_core_fix():
    """Restarts this script with OPENBLAS_CORETYPE set when OpenBLAS would fall back to its generic Prescott (SSE3)
    kernels on a CPU with AVX-512 or AVX2: OpenBLAS 0.3.21 (Debian 12) does not know newer Intel models (e.g. family 6
    model 207) and then runs its matrix products at half speed or less. Must run before torch or numpy load OpenBLAS:
    it reads the variable once, when it is loaded. Returns a note for the output, or "" when nothing was changed."""
    if os.environ.get("CPU_COMPARE_OPENBLAS_NOTE") is not None:
        return os.environ["CPU_COMPARE_OPENBLAS_NOTE"]
    if "OPENBLAS_CORETYPE" in os.environ:
        return f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} set by the caller"
    try:
        lib = ctypes.CDLL("libblas.so.3")  # what torch links against (Debian's alternatives pick the library)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return ""  # not OpenBLAS
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    want = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else ""
    if core.lower() != "prescott" or not want:
        return ""
    note = f"OpenBLAS chose its generic {core} kernels on this CPU, so OPENBLAS_CORETYPE={want} was set for the reference"
    env = dict(os.environ, OPENBLAS_CORETYPE=want, CPU_COMPARE_OPENBLAS_NOTE=note)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def omp_wait_policy():
    """Sets OMP_WAIT_POLICY=PASSIVE unless the caller set it. Debian's torch runs its own parallel loops on libgomp
    threads, which by default spin for a while after each parallel region, and OpenBLAS (pthread build) runs each
    matrix product on its own threads, which spin too: with as many threads in each pool as there are cores, the
    two pools take the cores from each other. Measured on the 2-core VM (the three cases of this benchmark): steps
    about 2x slower and +-30% from step to step with libgomp's default, steady with PASSIVE (libgomp's idle
    threads sleep). libgomp reads the variable when it is loaded, so this runs before torch is imported."""
    if "OMP_WAIT_POLICY" in os.environ:
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} set by the caller"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return ("OMP_WAIT_POLICY=PASSIVE set for the reference (with libgomp's default, its spinning threads and OpenBLAS's "
            "take the cores from each other: about 2x slower steps on a 2-core VM)")


NOTES = [n for n in (openblas_core_fix(), omp_wait_policy()) if n]  # before torch and numpy load OpenBLAS, libgomp

import numpy as np  # noqa: E402  (after the OpenBLAS check: numpy loads OpenBLAS too)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

NP_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """Returns {name: tensor} of a safetensors file: float tensors as float32, integer ones as int64."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        dt = info["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4")
        elif dt in NP_DTYPES:
            arr = np.frombuffer(raw, NP_DTYPES[dt])
        else:
            sys.exit(f"{path}: tensor {name}: dtype {dt} not supported by the reference")
        arr = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
        out[name] = torch.from_numpy(arr.copy()).reshape(info["shape"])
    return out


def read_checkpoint(folder):
    """Reads model.safetensors, or the shards named by model.safetensors.index.json."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        out.update(read_safetensors(os.path.join(folder, name)))
    return out


class Module(nn.Module):
    """A plain container, so that parameter names follow the Hugging Face checkpoint's."""


class LoRALinear(nn.Module):
    """A frozen Linear plus LoRA factors: y = x W^T + b + scale (x A^T) B^T (B starts at zero)."""

    def __init__(self, inp, out, bias, r, alpha):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, inp), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out), requires_grad=False) if bias else None
        self.lora_A = nn.Linear(inp, r, bias=False)
        self.lora_B = nn.Linear(r, out, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(x)) * self.scale


def linear_factory(lora):
    """Returns a function making the model's adaptable linear layers: plain Linear, or LoRALinear when lora."""
    def make(inp, out, bias=True):
        if lora is None:
            return nn.Linear(inp, out, bias=bias)
        return LoRALinear(inp, out, bias, lora["r"], lora["alpha"])
    return make


# ---------------------------------------------------------------- ViT (transformers' ViTForImageClassification)

class ViTLayer(nn.Module):
    def __init__(self, c, linear):
        super().__init__()
        d, m = c["hidden_size"], c["intermediate_size"]
        eps, qkv_bias = c.get("layer_norm_eps", 1e-12), c.get("qkv_bias", True)
        self.heads = c["num_attention_heads"]
        self.layernorm_before = nn.LayerNorm(d, eps=eps)
        self.attention = Module()
        self.attention.attention = Module()
        self.attention.attention.query = linear(d, d, qkv_bias)
        self.attention.attention.key = linear(d, d, qkv_bias)
        self.attention.attention.value = linear(d, d, qkv_bias)
        self.attention.output = Module()
        self.attention.output.dense = linear(d, d)
        self.layernorm_after = nn.LayerNorm(d, eps=eps)
        self.intermediate = Module()
        self.intermediate.dense = linear(d, m)
        self.output = Module()
        self.output.dense = linear(m, d)

    def forward(self, x):
        b, n, d = x.shape
        h, dh = self.heads, d // self.heads
        a = self.attention.attention
        y = self.layernorm_before(x)
        q = a.query(y).view(b, n, h, dh).transpose(1, 2)
        k = a.key(y).view(b, n, h, dh).transpose(1, 2)
        v = a.value(y).view(b, n, h, dh).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        ctx = (p @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.attention.output.dense(ctx)
        y = self.intermediate.dense(self.layernorm_after(x))
        return x + self.output.dense(F.gelu(y))  # exact (erf) GELU


class ViT(nn.Module):
    def __init__(self, c, lora):
        super().__init__()
        d, p, ch = c["hidden_size"], c["patch_size"], c.get("num_channels", 3)
        n = (c["image_size"] // p) ** 2
        labels = len(c.get("id2label") or {}) or c.get("num_labels", 2)
        linear = linear_factory(lora)
        self.vit = Module()
        self.vit.embeddings = Module()
        self.vit.embeddings.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.vit.embeddings.position_embeddings = nn.Parameter(torch.zeros(1, n + 1, d))
        self.vit.embeddings.patch_embeddings = Module()
        self.vit.embeddings.patch_embeddings.projection = nn.Conv2d(ch, d, kernel_size=p, stride=p)
        self.vit.encoder = Module()
        self.vit.encoder.layer = nn.ModuleList([ViTLayer(c, linear) for _ in range(c["num_hidden_layers"])])
        self.vit.layernorm = nn.LayerNorm(d, eps=c.get("layer_norm_eps", 1e-12))
        self.classifier = nn.Linear(d, labels)  # the head: never adapted, as PEFT's all-linear

    def loss(self, batch):
        e = self.vit.embeddings
        x = e.patch_embeddings.projection(batch["pixel_values"]).flatten(2).transpose(1, 2)
        x = torch.cat([e.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + e.position_embeddings
        for layer in self.vit.encoder.layer:
            x = layer(x)
        logits = self.classifier(self.vit.layernorm(x)[:, 0])
        return F.cross_entropy(logits, batch["labels"])


# ---------------------------------------------------------------- LLaMA (transformers' LlamaForCausalLM)

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, c, linear):
        super().__init__()
        d, m = c["hidden_size"], c["intermediate_size"]
        self.heads, self.kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        self.dh = c.get("head_dim") or d // self.heads
        ab, mb, eps = c.get("attention_bias", False), c.get("mlp_bias", False), c.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Module()
        self.self_attn.q_proj = linear(d, self.heads * self.dh, ab)
        self.self_attn.k_proj = linear(d, self.kv * self.dh, ab)
        self.self_attn.v_proj = linear(d, self.kv * self.dh, ab)
        self.self_attn.o_proj = linear(self.heads * self.dh, d, ab)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = Module()
        self.mlp.gate_proj = linear(d, m, mb)
        self.mlp.up_proj = linear(d, m, mb)
        self.mlp.down_proj = linear(m, d, mb)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        a = self.self_attn
        y = self.input_layernorm(x)
        q = a.q_proj(y).view(b, t, self.heads, self.dh).transpose(1, 2)
        k = a.k_proj(y).view(b, t, self.kv, self.dh).transpose(1, 2)
        v = a.v_proj(y).view(b, t, self.kv, self.dh).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv
        if rep > 1:  # grouped-query attention: query head h reads key/value head h // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh) + mask, dim=-1)
        ctx = (p @ v).transpose(1, 2).reshape(b, t, self.heads * self.dh)
        x = x + a.o_proj(ctx)
        y = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(y)) * self.mlp.up_proj(y))


class Llama(nn.Module):
    def __init__(self, c, lora):
        super().__init__()
        if c.get("rope_scaling"):
            sys.exit("the reference implements plain RoPE only (rope_scaling is set in config.json)")
        if c.get("hidden_act", "silu") != "silu":
            sys.exit(f"the reference implements SiLU only, config.json has {c['hidden_act']}")
        d, vocab = c["hidden_size"], c["vocab_size"]
        linear = linear_factory(lora)
        self.model = Module()
        self.model.embed_tokens = nn.Embedding(vocab, d)
        self.model.layers = nn.ModuleList([LlamaLayer(c, linear) for _ in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(d, c.get("rms_norm_eps", 1e-6))
        self.tied = bool(c.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(d, vocab, bias=False)  # the head: never adapted, as PEFT's all-linear
        dh = self.model.layers[0].dh
        self.inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, dh, 2, dtype=torch.int64).float() / dh))

    def loss(self, batch):
        ids = batch["input_ids"]
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        x = self.model.norm(x)
        logits = F.linear(x, self.model.embed_tokens.weight) if self.tied else self.lm_head(x)
        v = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, v), batch["labels"][:, 1:].reshape(-1))


# ---------------------------------------------------------------- RoBERTa (transformers' RobertaForMaskedLM)

class RobertaLayer(nn.Module):
    def __init__(self, c, linear):
        super().__init__()
        d, m, eps = c["hidden_size"], c["intermediate_size"], c.get("layer_norm_eps", 1e-12)
        self.heads = c["num_attention_heads"]
        self.attention = Module()
        self.attention.self = Module()
        self.attention.self.query = linear(d, d)
        self.attention.self.key = linear(d, d)
        self.attention.self.value = linear(d, d)
        self.attention.output = Module()
        self.attention.output.dense = linear(d, d)
        self.attention.output.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.intermediate = Module()
        self.intermediate.dense = linear(d, m)
        self.output = Module()
        self.output.dense = linear(m, d)
        self.output.LayerNorm = nn.LayerNorm(d, eps=eps)

    def forward(self, x, mask):
        b, n, d = x.shape
        h, dh = self.heads, d // self.heads
        a = self.attention.self
        q = a.query(x).view(b, n, h, dh).transpose(1, 2)
        k = a.key(x).view(b, n, h, dh).transpose(1, 2)
        v = a.value(x).view(b, n, h, dh).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh) + mask, dim=-1)
        ctx = (p @ v).transpose(1, 2).reshape(b, n, d)
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(ctx))  # post-LN
        y = F.gelu(self.intermediate.dense(x))  # exact (erf) GELU
        return self.output.LayerNorm(x + self.output.dense(y))


class RobertaMLM(nn.Module):
    """RobertaForMaskedLM: word + position + token-type embeddings and LayerNorm, post-LN blocks, and the LM head
    (dense -> exact GELU -> LayerNorm -> decoder tied to the word embeddings, plus lm_head.bias); no dropout, as
    memfit trains encoders. Loss: mean cross entropy over the labelled positions (-100 elsewhere)."""

    def __init__(self, c, lora):
        super().__init__()
        if c.get("hidden_act", "gelu") != "gelu":
            sys.exit(f"the reference implements exact GELU only, config.json has {c['hidden_act']}")
        if c.get("position_embedding_type", "absolute") != "absolute":
            sys.exit("the reference implements absolute position embeddings only")
        if not c.get("tie_word_embeddings", True):
            sys.exit("the reference implements a decoder tied to the word embeddings only")
        d, vocab, eps = c["hidden_size"], c["vocab_size"], c.get("layer_norm_eps", 1e-12)
        linear = linear_factory(lora)
        self.pad = c.get("pad_token_id", 1)
        self.roberta = Module()
        e = self.roberta.embeddings = Module()
        e.word_embeddings = nn.Embedding(vocab, d)
        e.position_embeddings = nn.Embedding(c["max_position_embeddings"], d)
        e.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 1), d)
        e.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.roberta.encoder = Module()
        self.roberta.encoder.layer = nn.ModuleList([RobertaLayer(c, linear) for _ in range(c["num_hidden_layers"])])
        self.lm_head = Module()  # the head: never adapted, as PEFT's all-linear
        self.lm_head.dense = nn.Linear(d, d)
        self.lm_head.layer_norm = nn.LayerNorm(d, eps=eps)
        self.lm_head.bias = nn.Parameter(torch.zeros(vocab))

    def loss(self, batch):
        ids = batch["input_ids"]
        e = self.roberta.embeddings
        real = (ids != self.pad).long()  # transformers' create_position_ids_from_input_ids
        pos = torch.cumsum(real, dim=1) * real + self.pad
        types = batch.get("token_type_ids")
        if types is None:
            types = torch.zeros_like(ids)
        x = e.LayerNorm(e.word_embeddings(ids) + e.token_type_embeddings(types) + e.position_embeddings(pos))
        am = batch.get("attention_mask")
        mask = 0.0 if am is None else (1.0 - am[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.roberta.encoder.layer:
            x = layer(x, mask)
        h = self.lm_head
        y = h.layer_norm(F.gelu(h.dense(x)))
        logits = F.linear(y, e.word_embeddings.weight, h.bias)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=-100)


# ---------------------------------------------------------------- loading, training, reporting

def build(spec):
    case, s = spec["case"], spec["settings"]
    with open(os.path.join(case["model"], "config.json")) as f:
        c = json.load(f)
    lora = None
    if case["method"] == "lora-all":
        lora = dict(r=s["lora_r"], alpha=s["lora_alpha"])
    elif case["method"] != "full":
        sys.exit(f"method {case['method']} is not implemented by the reference (full, lora-all)")
    kind = c.get("model_type")
    model = {"vit": ViT, "llama": Llama, "roberta": RobertaMLM}.get(kind)
    if model is None:
        sys.exit(f"model type {kind} is not implemented by the reference (vit, llama, roberta)")
    if kind == "roberta" and (c.get("architectures") or ["RobertaForMaskedLM"])[0] != "RobertaForMaskedLM":
        sys.exit(f"the reference implements RoBERTa as RobertaForMaskedLM only, config.json has {c['architectures'][0]}")
    model = model(c, lora)
    ckpt = read_checkpoint(case["model"])
    if kind == "llama" and model.tied:
        ckpt.pop("lm_head.weight", None)  # a tied head may be stored too; the embeddings are the head
    if kind == "roberta":
        ckpt.pop("lm_head.decoder.weight", None)  # the tied decoder may be stored too; the embeddings are the head
        ckpt.pop("lm_head.decoder.bias", None)  # transformers ties it to lm_head.bias
        ckpt.pop("roberta.embeddings.position_ids", None)  # a buffer some checkpoints keep
    state = model.state_dict()
    base = {n for n in state if ".lora_" not in n}
    if set(ckpt) != base:
        sys.exit(f"checkpoint and reference disagree on parameter names: only in the checkpoint "
                 f"{sorted(set(ckpt) - base)[:5]}, only in the reference {sorted(base - set(ckpt))[:5]}")
    for n, t in ckpt.items():
        if tuple(t.shape) != tuple(state[n].shape):
            sys.exit(f"{n}: checkpoint shape {tuple(t.shape)}, reference {tuple(state[n].shape)}")
    if lora is not None:
        adapters = {n for n in state if ".lora_" in n}
        init = read_safetensors(spec["init_file"]) if spec.get("init_file") else {}
        if not init:
            sys.exit("LoRA needs memfit's initial adapters (the spec's init_file), so that both sides start alike")
        if set(init) != adapters:
            sys.exit(f"memfit's adapters and the reference's differ: only memfit {sorted(set(init) - adapters)[:5]}, "
                     f"only the reference {sorted(adapters - set(init))[:5]}")
        ckpt.update(init)
    model.load_state_dict(ckpt, strict=True)
    for n, p in model.named_parameters():
        p.requires_grad_(lora is None or ".lora_" in n)
    return model


def hwm_bytes():
    """The process's resident-set high-water mark (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def blas_info():
    """Names the BLAS library this process loaded (from /proc/self/maps) and, for OpenBLAS, its configuration."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path).lower():
                libs.add(path)
    for path in sorted(libs):
        if "openblas" in os.path.basename(path).lower():
            try:
                lib = ctypes.CDLL(path)
                lib.openblas_get_config.restype = ctypes.c_char_p
                return f"{lib.openblas_get_config().decode()} ({path}, {lib.openblas_get_num_threads()} threads)"
            except (OSError, AttributeError):
                return path
    return ", ".join(sorted(libs)) or "none found in /proc/self/maps"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="spec file written by finetune bench cpu")
    ap.add_argument("--json", required=True, help="write the result here")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: every core)")
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    case, s = spec["case"], spec["settings"]
    if s["dtype"] != "float32":
        sys.exit("the reference runs float32 only")
    torch.set_num_threads(args.threads)
    torch.manual_seed(s["seed"])
    model = build(spec)
    model.train()
    batch = read_safetensors(spec["batch_file"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"],
                            weight_decay=s["weight_decay"])
    rss_before = hwm_bytes()
    losses, times = [], []
    for i in range(s["warmup"] + s["steps"]):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        d = time.perf_counter() - start
        if i >= s["warmup"]:
            times.append(d)
        if not math.isfinite(losses[-1]):
            sys.exit(f"non-finite loss at step {i + 1}")
    med = statistics.median(times)
    per_step = case["batch"] * (case.get("seq") or 1)
    result = dict(side="pytorch", case=f"{case['key']}-{case['name']}", variant="plain", losses=losses,
                  warmup=s["warmup"], step_seconds=times, median_step_seconds=med, per_second=per_step / med,
                  unit="tokens/s" if case.get("seq") else "images/s", threads=torch.get_num_threads(),
                  rss_before_train_bytes=rss_before, max_rss_bytes=max(hwm_bytes(), rss_before),  # VmHWM is read approximately
                  versions=dict(torch=torch.__version__, numpy=np.__version__, python=platform.python_version(),
                                blas=blas_info(), notes="; ".join(NOTES), threads=str(torch.get_num_threads())))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(dict(first_loss=losses[0], median_step_seconds=med)))


if __name__ == "__main__":
    main()
