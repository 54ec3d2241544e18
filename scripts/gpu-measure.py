#!/usr/bin/env python3
"""Kernel measurements the simulator's GPU profiles need and fsdp-run calibrate does not take (issues M9 item 6, M12),
run by scripts/gpu-check.sh step 6 on the GPU machine's PyTorch (torch 2.x with CUDA; nothing else imported).

Each series is written to OUT/gpu-measure.json and summarised on stdout, one line a series; a series that fails
records its error and the others still run:

  triad        a = b + c over three fp32 arrays of 256 MiB (STREAM's triad, 12 bytes an element): the bandwidth the
               fractions below are taken against (fsdp-run calibrate measures its device bandwidth the same way).
  sdpa_flash   F.scaled_dot_product_attention restricted to the flash backend (torch.nn.attention.sdpa_kernel), bf16,
               causal, 16384 tokens a call and 2048 / head_dim heads (FlashAttention's own benchmark shapes, which
               hwprofiles/h100-80gb.yaml's curves were read at, head dim 128), at head dims 64, 128 and 256 and
               sequences 1024 to 8192: forward and backward TFLOP/s by the simulator's FLOP convention (forward
               4 b s^2 h d halved when causal, backward 2.5 x forward; simulator/compute/compute_cost.cpp). Whether the
               attention curves need a head-dim term (the Ultra-Scale Playbook's 1B runs head dim 64, its 3B 96).
  cross_entropy F.cross_entropy over 16384 rows of fp32 logits at V 32k, 64k and 128k, forward and forward + input
               gradient (torch.autograd.grad, nothing accumulated): the fraction of the triad at SoftMax.cu's 4 and 5
               passes (docs/hardware.md "Cross-entropy kernels"; hwprofiles/h200-141gb.yaml's softmax_efficiency is
               the A100's 0.80, not measured on this GPU).
  vocab_parallel_loss  Megatron-LM's unfused vocab_parallel_cross_entropy at TP 1 written out as its kernels (the fp32
               upcast, max, in-place subtraction, exp, sum, in-place division; backward the in-place multiply and the
               cast back: 38 and 14 bytes a bf16 logit), nanotron's loss: the fraction of the triad (docs/hardware.md
               "Cross-entropy kernels": Liger-Kernel measured 0.77 of HBM on an H100; the model prices 0.54).
  float8_gemm  torch._scaled_mm (E4M3 operands, tensorwise scales, bf16 output) with use_fast_accum True (torchao's
               output GEMM) and False (its two gradient GEMMs), beside torch.mm in bf16, at a large square shape and
               at Llama 3 8B's linears on 16384 tokens, whole and at tp 8: TFLOP/s each, and the FP8 fraction of its
               peak over the bf16 fraction of its own, the quantity the profiles' device.float8_matmul_ratio states
               (hwprofiles/h100-80gb.yaml 0.883, h200-141gb.yaml 0.915, from stas00's MAMF table), each against
               the datasheet peaks those two profiles give (989.5 and 1979 TFLOP/s).

Timing: CUDA events around REPEATS calls after WARMUP calls, the median of ROUNDS rounds.

  python3 scripts/gpu-measure.py OUT_DIR
"""
import json
import os
import statistics
import sys
import time

WARMUP, REPEATS, ROUNDS = 3, 10, 5
MIB = 1024 * 1024


def timed(torch, fn):
    """Median seconds a call over ROUNDS rounds of REPEATS calls (CUDA events), after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPEATS):
            fn()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / 1e3 / REPEATS)
    return statistics.median(rounds)


def triad(torch):
    n = 256 * MIB // 4
    a, b, c = (torch.empty(n, device="cuda"), torch.rand(n, device="cuda"), torch.rand(n, device="cuda"))
    t = timed(torch, lambda: torch.add(b, c, out=a))
    return {"bytes_per_s": 12.0 * n / t, "array_mib": 256}


def sdpa_flash(torch):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for head_dim in (64, 128, 256):
        heads = 2048 // head_dim
        for seq in (1024, 2048, 4096, 8192):
            batch = 16384 // seq
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            go = torch.randn_like(q)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                fwd = timed(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                def both():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(o, (q, k, v), go)

                total = timed(torch, both)
            flops = 4.0 * batch * seq * seq * heads * head_dim / 2.0
            bwd = max(total - fwd, 1e-9)
            rows.append({"head_dim": head_dim, "heads": heads, "batch": batch, "seq": seq, "forward_s": fwd,
                         "backward_s": bwd, "forward_tflops": flops / fwd / 1e12,
                         "backward_tflops": 2.5 * flops / bwd / 1e12})
            del q, k, v, go
    return {"rows": rows}


def cross_entropy(torch, bandwidth):
    import torch.nn.functional as F

    rows = []
    for vocab in (32768, 65536, 131072):
        n = 16384
        x = torch.randn(n, vocab, device="cuda")
        target = torch.randint(0, vocab, (n,), device="cuda")
        fwd = timed(torch, lambda: F.cross_entropy(x, target))
        xg = x.clone().requires_grad_(True)
        total = timed(torch, lambda: torch.autograd.grad(F.cross_entropy(xg, target), xg))
        logit_bytes = 4.0 * n * vocab
        bwd = max(total - fwd, 1e-9)
        rows.append({"rows": n, "vocab": vocab, "forward_s": fwd, "backward_s": bwd,
                     "forward_fraction": 4.0 * logit_bytes / fwd / bandwidth,
                     "backward_fraction": 5.0 * logit_bytes / bwd / bandwidth})
        del x, xg
    return {"rows": rows}


def vocab_parallel_loss(torch, bandwidth):
    rows = []
    for vocab in (32768, 65536, 131072):
        n = 8192
        logits = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (n,), device="cuda")
        arange = torch.arange(n, device="cuda")

        def forward():
            x = logits.float()                       # the upcast: read 2, write 4
            m = torch.max(x, dim=-1)[0]              # read 4
            x -= m.unsqueeze(-1)                     # read 4, write 4
            predicted = x[arange, target].clone()
            torch.exp(x, out=x)                      # read 4, write 4
            s = x.sum(dim=-1)                        # read 4
            x.div_(s.unsqueeze(-1))                  # read 4, write 4
            return x, torch.log(s) - predicted

        softmax, _ = forward()
        grad_output = torch.ones(n, device="cuda")

        def backward():
            g = softmax.clone()                      # not timed apart: subtracted below
            g[arange, target] -= 1.0
            g.mul_(grad_output.unsqueeze(-1))        # read 4, write 4
            return g.to(torch.bfloat16)              # the cast back: read 4, write 2

        fwd = timed(torch, forward)
        clone = timed(torch, lambda: softmax.clone())
        bwd = max(timed(torch, backward) - clone, 1e-9)
        elems = float(n) * vocab
        rows.append({"rows": n, "vocab": vocab, "forward_s": fwd, "backward_s": bwd,
                     "forward_fraction": 38.0 * elems / fwd / bandwidth,
                     "backward_fraction": 14.0 * elems / bwd / bandwidth})
        del logits, softmax
    return {"rows": rows}


# (m, n, k): a large square GEMM, and Llama 3 8B's q, k/v, o, gate/up and down projections on 16384 tokens, whole and
# split by tp 8 (configs/models/llama3-8b.yaml: hidden 4096, 8 kv heads of 128, ffn 14336).
FLOAT8_SHAPES = [(8192, 8192, 8192), (16384, 4096, 4096), (16384, 1024, 4096), (16384, 14336, 4096),
                 (16384, 4096, 14336), (16384, 512, 4096), (16384, 1792, 4096), (16384, 4096, 1792)]
# The dense tensor-core peaks the shipped H100 and H200 profiles give (TFLOP/s): bf16 and FP8.
PEAK_BF16, PEAK_FP8 = 989.5e12, 1979e12


def float8_gemm(torch):
    rows = []
    for m, n, k in FLOAT8_SHAPES:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device="cuda")
        abf, bbf = a.to(torch.bfloat16), b.to(torch.bfloat16)
        flops = 2.0 * m * n * k
        fast = timed(torch, lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True))
        slow = timed(torch, lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=False))
        bf16 = timed(torch, lambda: torch.mm(abf, bbf))
        rows.append({"m": m, "n": n, "k": k, "fast_accum_tflops": flops / fast / 1e12,
                     "tflops": flops / slow / 1e12, "bf16_tflops": flops / bf16 / 1e12,
                     "fast_accum_ratio": (flops / fast / PEAK_FP8) / (flops / bf16 / PEAK_BF16),
                     "ratio": (flops / slow / PEAK_FP8) / (flops / bf16 / PEAK_BF16)})
        del a, b, abf, bbf
    return {"rows": rows}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu-measure: no CUDA device")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "date": time.strftime("%Y-%m-%d")}
    bandwidth = None
    for name, fn in (("triad", lambda: triad(torch)), ("sdpa_flash", lambda: sdpa_flash(torch)),
                     ("cross_entropy", lambda: cross_entropy(torch, bandwidth)),
                     ("vocab_parallel_loss", lambda: vocab_parallel_loss(torch, bandwidth)),
                     ("float8_gemm", lambda: float8_gemm(torch))):
        if name not in ("triad", "sdpa_flash", "float8_gemm") and not bandwidth:
            report[name] = {"error": "no triad bandwidth to take fractions of"}
            continue
        try:
            report[name] = fn()
            if name == "triad":
                bandwidth = report[name]["bytes_per_s"]
        except Exception as e:  # one series failing leaves the others
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "gpu-measure.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name in ("triad", "sdpa_flash", "cross_entropy", "vocab_parallel_loss", "float8_gemm"):
        r = report[name]
        if "error" in r:
            print(f"{name}: error {r['error']}")
        elif name == "triad":
            print(f"triad: {r['bytes_per_s'] / 1e9:.0f} GB/s")
        elif name == "sdpa_flash":
            by_dim = {}
            for row in r["rows"]:
                by_dim.setdefault(row["head_dim"], []).append(f"{row['forward_tflops']:.0f}/{row['backward_tflops']:.0f}")
            print("sdpa_flash fwd/bwd TFLOP/s at seq 1k..8k: " +
                  "; ".join(f"hd {d}: {' '.join(v)}" for d, v in by_dim.items()))
        elif name == "float8_gemm":
            print("float8_gemm FP8/bf16 efficiency, gradient (fast-accumulation) GEMMs: " + " ".join(
                f"{row['m']}x{row['n']}x{row['k']} {row['ratio']:.3f} ({row['fast_accum_ratio']:.3f})"
                for row in r["rows"]))
        else:
            print(f"{name} fraction of triad fwd/bwd: " + " ".join(
                f"V{row['vocab'] // 1024}k {row['forward_fraction']:.3f}/{row['backward_fraction']:.3f}"
                for row in r["rows"]))
    return 0 if not any("error" in report[n] for n in report if isinstance(report[n], dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
