"""Plain-PyTorch LLaMA logits of a Hugging Face checkpoint folder: the reference of memfit's merged export.

    /usr/bin/python3 bench/pytorch/merged_logits.py --model DIR --inputs INPUTS.json

Reads only DIR/config.json and the safetensors weights (model.safetensors, or the shards of
model.safetensors.index.json; parsed by hand: 8-byte header length, JSON header, raw data), builds cpu_compare.py's
plain-torch LLaMA (RMSNorm, rotary embeddings as transformers computes them, grouped-query attention, SwiGLU, tied
embeddings; no transformers, no PEFT) and prints {"logits": [...]} for the input_ids of INPUTS.json (a causal
mask, every position), float32, as `finetune logits` prints them. cli.TestMergedExportIsAModelFolder compares the
two on a merged LoRA run.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_compare as ref  # noqa: E402  (sets OPENBLAS_CORETYPE / OMP_WAIT_POLICY before torch loads)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "llama":
        sys.exit(f"{folder}: model type {c.get('model_type')}, the reference reads LLaMA only")
    archs = c.get("architectures") or ["LlamaForCausalLM"]
    if archs[0] != "LlamaForCausalLM":
        sys.exit(f"{folder}: {archs[0]}, the reference computes a causal LM's logits only")
    model = ref.Llama(c, None)
    ckpt = ref.read_checkpoint(folder)
    if model.tied:
        ckpt.pop("lm_head.weight", None)
    model.load_state_dict(ckpt, strict=True)
    model.eval()
    return model


def logits(model, ids):
    """Logits [B, T, vocab] of every position of ids [B, T]."""
    t = ids.shape[1]
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), model.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((t, t), float("-inf")).triu(1)
    x = model.model.embed_tokens(ids)
    for layer in model.model.layers:
        x = layer(x, cos, sin, mask)
    x = model.model.norm(x)
    return F.linear(x, model.model.embed_tokens.weight) if model.tied else model.lm_head(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="LLaMA checkpoint folder (config.json + safetensors)")
    p.add_argument("--inputs", required=True, help='JSON file with {"input_ids": [[...], ...]}')
    a = p.parse_args()
    with open(a.inputs) as f:
        inputs = json.load(f)
    inputs = inputs.get("inputs", inputs)
    ids = torch.tensor(inputs["input_ids"], dtype=torch.int64)
    with torch.no_grad():
        out = logits(load(a.model), ids)
    json.dump({"logits": out.tolist()}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
