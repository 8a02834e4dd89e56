"""Tests of the PyTorch reference side's Approx-BP pieces (peft_compare.py), on the CPU with any PyTorch >= 1.13.

    python3 bench/pytorch/test_reference.py

They check that the reference method is the method memfit implements: the coefficients are memfit's (read from
approxbp/coefficients.go), ReGELU2 / ReSiLU2 have the exact forward and the 2-bit step backward, MS-LN / MS-RMSNorm
have the exact normalisation gradient, folding the affine into the next linear layer gives the same outputs, and
the saved-tensor bytes of a norm followed by a linear layer drop by the shared tensor (what the GPU comparison
measures with torch.cuda.max_memory_allocated).
"""
import os
import re
import sys
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peft_compare as pc  # noqa: E402


def go_coefficients(name):
    """Reads memfit's published coefficients (A, C) for name from approxbp/coefficients.go."""
    with open(os.path.join(HERE, "..", "..", "approxbp", "coefficients.go")) as f:
        src = f.read()
    block = src[src.index(name + "Coefficients = Coefficients{"):]
    block = block[:block.index("}\n")]
    nums = lambda key: [float(v) for v in re.search(key + r":\s*\[\]float64\{([^}]*)\}", block).group(1).split(",")]
    return nums("A"), nums("C")


def saved_bytes(fn, params, *inputs):
    """Bytes of the distinct activations autograd saves while fn runs (shared storage counted once; params, which
    are resident anyway, not counted)."""
    seen = {}
    skip = {p.storage().data_ptr() for p in params}

    def pack(t):
        if t.storage().data_ptr() not in skip:
            seen[(t.storage().data_ptr(), t.storage().size())] = t.storage().size() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    return sum(seen.values()), out


class ReferenceTest(unittest.TestCase):
    def test_coefficients_are_memfits(self):
        for name, mine in (("ReGELU2", pc.REGELU2), ("ReSiLU2", pc.RESILU2)):
            a, c = go_coefficients(name)
            self.assertEqual(a, mine["A"], name)
            self.assertEqual(c, mine["C"], name)

    def test_pack_roundtrip(self):
        for n in (1, 4, 7, 1000):
            codes = torch.randint(0, 4, (n,), dtype=torch.uint8)
            packed, m = pc.pack2(codes)
            self.assertEqual(packed.numel(), (n + 3) // 4)
            self.assertTrue(torch.equal(pc.unpack2(packed, m), codes))

    def test_react2_forward_exact_backward_step(self):
        torch.manual_seed(0)
        for kind, exact, coeffs in (("gelu", F.gelu, pc.REGELU2), ("silu", F.silu, pc.RESILU2)):
            x = torch.cat([torch.randn(997) * 4, torch.tensor(coeffs["C"]), torch.tensor([-50.0, 50.0])])
            x.requires_grad_(True)
            y = pc._ReAct2.apply(x, kind)
            self.assertTrue(torch.equal(y, exact(x.detach())), kind)
            g = torch.randn_like(y)
            y.backward(g)
            levels = pc.levels(coeffs)
            code = sum((x.detach() > c).long() for c in coeffs["C"])  # breakpoints strictly below x
            want = g * torch.tensor(levels)[code]
            self.assertTrue(torch.allclose(x.grad, want, rtol=0, atol=1e-7), kind)
            # What the backward keeps: 2 bits per element, packed four to a byte, and nothing of x.
            z = torch.randn(1000, requires_grad=True)
            kept, _ = saved_bytes(lambda t: pc._ReAct2.apply(t, kind), [], z)
            self.assertEqual(kept, 250, kind)

    def test_msnorm_gradient(self):
        torch.manual_seed(1)
        for rms in (False, True):
            x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)

            def ref(x):
                if rms:
                    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                return F.layer_norm(x, (16,), eps=1e-6)

            y = pc._MSNorm.apply(x, 1e-6, rms)
            self.assertTrue(torch.allclose(y, ref(x), atol=1e-12))
            g = torch.randn_like(y)
            (gx,) = torch.autograd.grad(y, x, g)
            (want,) = torch.autograd.grad(ref(x), x, g)
            self.assertTrue(torch.allclose(gx, want, atol=1e-10), "rms" if rms else "ln")

    def test_fold_affine_same_outputs(self):
        torch.manual_seed(2)
        for rms in (False, True):
            d = 16
            if rms:
                norm = nn.Module()
                norm.weight = nn.Parameter(torch.rand(d) + 0.5)
                norm.variance_epsilon = 1e-6
                plain = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
            else:
                norm = nn.LayerNorm(d, eps=1e-6)
                with torch.no_grad():
                    norm.weight.uniform_(0.5, 1.5)
                    norm.bias.normal_()
                plain = norm
            lins = [nn.Linear(d, 8), nn.Linear(d, 4, bias=False)]
            x = torch.randn(6, d)
            with torch.no_grad():
                want = [lin(plain(x)) for lin in lins]
                ms = pc.fold_affine(norm, lins)
                got = [lin(ms(x)) for lin in lins]
            for w, g in zip(want, got):
                self.assertTrue(torch.allclose(w, g, atol=1e-5), "rms" if rms else "ln")

    def test_shared_saved_tensor(self):
        """Under LoRA (frozen W, trainable A and B reading the norm's output), LayerNorm + Linear keeps the norm's
        input and its output (for A's gradient); MS-LN + Linear keeps only the normalised output, shared by the
        norm's backward and A's: one [N, D] tensor less."""
        torch.manual_seed(3)
        n, d, r = 64, 32, 4
        lin = nn.Linear(d, d)
        lin.weight.requires_grad_(False)
        lin.bias.requires_grad_(False)
        a, b = nn.Linear(d, r, bias=False), nn.Linear(r, d, bias=False)
        ln = nn.LayerNorm(d)
        ms = pc.MSNorm(1e-5, rms=False)
        lora = lambda h: lin(h) + b(a(h))
        x = torch.randn(n, d, requires_grad=True)
        params = [q for m in (lin, a, b, ln) for q in m.parameters()]
        plain_bytes, _ = saved_bytes(lambda t: lora(ln(t)), params, x)
        ms_bytes, _ = saved_bytes(lambda t: lora(ms(t)), params, x)
        row = n * d * 4
        self.assertLess(ms_bytes, 2 * row)  # the normalised output once (+ 1/std and A's small output)
        self.assertGreaterEqual(plain_bytes - ms_bytes, row)  # at least one [N, D] tensor less


if __name__ == "__main__":
    unittest.main(verbosity=2)
