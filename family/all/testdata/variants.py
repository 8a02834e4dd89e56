#!/usr/bin/env python3
"""Reference checkpoints of decoder configurations beyond the shared goldens (../shared/data/golden/*_a), made with
the same plain-PyTorch re-implementation of transformers 4.55.4 (families_reference.py, imported from the folder
given first) and then, for some, written in another transformers version's config.json layout:

    python3 variants.py SHARED_GOLDEN_DIR OUT_DIR

Each OUT_DIR/<name> holds config.json, model.safetensors and golden.json as the shared goldens do. family/all's
TestFamilyVariants runs memfit on them (it skips where Debian's python3-torch is not installed; CI installs it).
"""
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
import families_reference as ref  # noqa: E402

longrope6 = dict(short=[1.0, 1.1, 1.3, 1.7, 2.3, 3.1], long=[1.2, 1.9, 2.8, 4.1, 6.0, 8.5])

VARIANTS = [
    # Qwen2.5 with sliding-window layers from max_window_layers on, untied head.
    dict(name="qwen2_sliding", family="qwen2", architecture="Qwen2ForCausalLM", seed=201, T=14, n_pad=3,
         config=dict(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=1, max_position_embeddings=64, rope_theta=1e6, tie_word_embeddings=False,
                     use_sliding_window=True, sliding_window=5, max_window_layers=1, bos_token_id=1, eos_token_id=2),
         grads=[], edit="drop_layer_types"),
    # Qwen3 with attention biases and linear rope scaling, written as transformers 5 writes configs.
    dict(name="qwen3_v5", family="qwen3", architecture="Qwen3ForCausalLM", seed=202, T=12, n_pad=2,
         config=dict(vocab_size=280, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rope_theta=5e5,
                     rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True, tie_word_embeddings=True,
                     bos_token_id=1, eos_token_id=2),
         grads=[], edit="v5"),
    # Mistral with a head_dim of its own and no sliding window.
    dict(name="mistral_headdim", family="mistral", architecture="MistralForCausalLM", seed=203, T=12, n_pad=2,
         config=dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=24, max_position_embeddings=64, sliding_window=None),
         grads=[]),
    # Gemma 2 with other caps, window and query scalar.
    dict(name="gemma2_b", family="gemma2", architecture="Gemma2ForCausalLM", seed=204, T=14, n_pad=3,
         config=dict(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=24, max_position_embeddings=64, query_pre_attn_scalar=16,
                     sliding_window=4, attn_logit_softcapping=10.0, final_logit_softcapping=20.0),
         grads=[]),
    # Gemma 3 with linear rope scaling on the full layers (Gemma-3-4B and larger), another pattern.
    dict(name="gemma3_scaled", family="gemma3", architecture="Gemma3ForCausalLM", seed=205, T=14, n_pad=3,
         config=dict(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, max_position_embeddings=64, query_pre_attn_scalar=24,
                     sliding_window=5, sliding_window_pattern=2, rope_scaling={"rope_type": "linear", "factor": 8.0}),
         grads=[]),
    # Phi-3 with longrope past its original context (the long factors, attention factor sqrt(2)) and a window.
    dict(name="phi3_longrope", family="phi3", architecture="Phi3ForCausalLM", seed=206, T=16, n_pad=3,
         config=dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=8,
                     partial_rotary_factor=0.75, sliding_window=10, tie_word_embeddings=False, bos_token_id=1,
                     eos_token_id=2, pad_token_id=0,
                     rope_scaling={"type": "longrope", "short_factor": longrope6["short"], "long_factor": longrope6["long"]}),
         grads=[]),
    # The same within its original context (the short factors).
    dict(name="phi3_longrope_short", family="phi3", architecture="Phi3ForCausalLM", seed=207, T=12, n_pad=2,
         config=dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=128, original_max_position_embeddings=32,
                     partial_rotary_factor=0.75, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                     rope_scaling={"type": "longrope", "short_factor": longrope6["short"], "long_factor": longrope6["long"]}),
         grads=[]),
]


def edit(path, how):
    """Rewrites config.json as another transformers version writes it."""
    c = json.load(open(path))
    if how == "drop_layer_types":  # transformers 4.4x: no layer_types
        c.pop("layer_types", None)
    elif how == "v5":  # transformers 5: dtype, rope_parameters holding rope_theta
        c["dtype"] = c.pop("torch_dtype")
        rp = dict(c.pop("rope_scaling") or {"rope_type": "default"})
        rp["rope_theta"] = c.pop("rope_theta")
        c["rope_parameters"] = rp
        c["transformers_version"] = "5.0.0"
    open(path, "w").write(ref.config_json_text(c))


if __name__ == "__main__":
    out = sys.argv[2]
    for spec in VARIANTS:
        spec = dict(spec)
        how = spec.pop("edit", None)
        r = ref.build(spec, out)
        if how:
            edit(os.path.join(out, spec["name"], "config.json"), how)
        print("%-20s loss %.6f max|logit| %.3f" % (r["name"], r["loss"], r["max_abs_logit"]))
