"""PyTorch reference for `finetune bench blocks` (the only Python in memfit: the reference side of a comparison).

Builds the same training step as memfit's block-stack benchmark: N ViT encoder layers of Hugging Face
transformers (ViTLayer, eager attention, float32, every weight trainable) on random input [batch, tokens, hidden],
loss = sum(h * target), backward (no optimizer step). Prints the peak of torch.cuda.max_memory_allocated during
one step and the median step time over --steps steps after two warm-up steps, as JSON.

    python3 bench/pytorch/vit_blocks.py --layers 12 --batch 64 --steps 10
"""
import argparse
import json
import statistics
import time

import torch
from transformers import ViTConfig
from transformers.models.vit.modeling_vit import ViTLayer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=197)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    torch.manual_seed(1)
    cfg = ViTConfig(hidden_size=768, num_hidden_layers=a.layers, num_attention_heads=12, intermediate_size=3072,
                    hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager")
    cfg._attn_implementation = "eager"
    layers = torch.nn.ModuleList([ViTLayer(cfg) for _ in range(a.layers)]).cuda().train()
    for m in layers.modules():  # no dropout, as memfit
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = torch.randn(a.batch, a.tokens, 768, device="cuda")
    target = torch.randn(a.batch, a.tokens, 768, device="cuda")

    def step():
        h = x
        for layer in layers:
            out = layer(h)
            h = out[0] if isinstance(out, tuple) else out
        loss = (h * target).sum()
        loss.backward()
        for q in layers.parameters():
            q.grad = None

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    times = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"framework": f"PyTorch {torch.__version__}, transformers ViTLayer (eager attention)",
                      "device": torch.cuda.get_device_name(), "layers": a.layers, "batch": a.batch, "tokens": a.tokens,
                      "dtype": "float32", "peak_bytes": peak, "resident_bytes_before_step": weights,
                      "peak_method": "torch.cuda.max_memory_allocated over one step",
                      "step_seconds_median": statistics.median(times), "steps": a.steps}, indent=1))


if __name__ == "__main__":
    main()
