#!/usr/bin/env python3
"""Reference checkpoints of encoder configurations beyond the shared goldens (../shared/data/golden/roberta_a,
roberta_reg_a, bert_a), made with the same plain-PyTorch re-implementation of transformers 4.55.4
(families_reference.py, imported from the folder given first):

    python3 variants.py SHARED_GOLDEN_DIR OUT_DIR

Each OUT_DIR/<name> holds config.json, model.safetensors and golden.json as the shared goldens do.
models/encoder's TestGoldenVariants runs memfit on them (it skips where Debian's python3-torch is not installed;
CI installs it).
"""
import sys

sys.path.insert(0, sys.argv[1])
import families_reference as ref  # noqa: E402

VARIANTS = [
    # RoBERTa deeper and narrower heads (6 heads of 8), LayerNorm eps 1e-12, 4 classes, a long padded row.
    dict(name="roberta_deep", family="roberta", architecture="RobertaForSequenceClassification", seed=301, T=18,
         n_pad=7,
         config=dict(vocab_size=300, hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                     intermediate_size=80, max_position_embeddings=24, type_vocab_size=1, layer_norm_eps=1e-12,
                     num_labels=4),
         grads=["roberta.encoder.layer.2.intermediate.dense.weight", "roberta.embeddings.LayerNorm.weight"]),
    # RoBERTa whose padding id is 0 (positions count from 1), bos 1, eos 2.
    dict(name="roberta_pad0", family="roberta", architecture="RobertaForSequenceClassification", seed=302, T=12,
         n_pad=3,
         config=dict(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, type_vocab_size=1, layer_norm_eps=1e-5,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, num_labels=2),
         grads=[]),
    # BERT regression (STS-B's head): one label, problem_type regression, three layers.
    dict(name="bert_reg", family="bert", architecture="BertForSequenceClassification", seed=303, T=20, n_pad=6,
         config=dict(vocab_size=260, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=100, max_position_embeddings=24, type_vocab_size=2, num_labels=1,
                     problem_type="regression"),
         grads=["bert.embeddings.position_embeddings.weight", "bert.pooler.dense.weight"]),
    # BERT with three token types, one layer, 3 classes, eps 1e-6.
    dict(name="bert_types3", family="bert", architecture="BertForSequenceClassification", seed=304, T=14, n_pad=2,
         config=dict(vocab_size=240, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=48, max_position_embeddings=14, type_vocab_size=3, layer_norm_eps=1e-6,
                     num_labels=3),
         grads=[]),
]

if __name__ == "__main__":
    ref.main(VARIANTS, sys.argv[2])
