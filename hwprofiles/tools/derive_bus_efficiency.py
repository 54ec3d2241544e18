#!/usr/bin/env python3
"""Derives the size dependence of the bus-efficiency curves in hwprofiles/*.yaml.

The collective model (simulator/comm/collective_cost.cpp) prices a ring collective as

    t(S) = latency + factor * S / (B * e(S))

with latency = base + intra_steps * alpha_intra + inter_steps * alpha_inter (NCCL's tuning
model, src/graph/tuning.cc), factor = 2(N-1)/N for all-reduce, B the tier bandwidth and e(S)
the profile's bus-efficiency curve. Given a published all-reduce sweep (busbw by size), the
efficiency the model needs at size S so that it reproduces the measured time is

    e_raw(S) = factor * S / (B * (t_meas(S) - latency)),   t_meas(S) = factor * S / busbw(S).

Only points whose measured time is at least twice the model latency are used (below that the
measurement is latency-dominated and says little about bandwidth). The raw values are divided by
the value at the largest size of the sweep (the plateau of that system), clipped at 1, made
non-decreasing by pool-adjacent-violators (isotonic) regression, and finally multiplied by the
plateau efficiency of the profile being written (which has its own citation). So the sweep gives
the *shape* (how fast a collective approaches its plateau) and each profile gives the plateau.

Run: python3 hwprofiles/tools/derive_bus_efficiency.py  (no dependencies)
"""

MiB = 1024**2
GiB = 1024**3
us = 1e-6
GB = 1e9

# NCCL src/graph/tuning.cc (NVIDIA/nccl commit b6475625): Ring/Simple base latency and per-step
# hardware latencies (NVLink, network), in microseconds.
BASE = 8.4 * us
ALPHA_NVLINK = 3.4 * us
ALPHA_NET = 14.0 * us

# Sweep 1 (NVLink/NVSwitch, one node, 8 ranks): nccl-tests all_reduce_perf on 8x H200 SXM,
# NCCL 2.30.7, busbw in GB/s, from stas00/ml-engineering network/benchmarks/README.md,
# section "How the calls are timed", column "nccl-tests".
H200_NODE = [
    (32 * 1024, 3.20), (64 * 1024, 6.26), (128 * 1024, 12.40), (256 * 1024, 24.63), (512 * 1024, 48.30),
    (1 * MiB, 72.45), (2 * MiB, 91.48), (4 * MiB, 139.97), (8 * MiB, 182.03), (16 * MiB, 242.45),
    (32 * MiB, 298.44), (64 * MiB, 369.82), (128 * MiB, 411.21), (256 * MiB, 442.27), (512 * MiB, 455.82),
    (1 * GiB, 464.00), (2 * GiB, 468.31), (4 * GiB, 473.10), (8 * GiB, 475.16), (16 * GiB, 480.70),
]

# Sweep 2 (network-bound ring, 4 nodes x 8 ranks, 8x 400 Gb/s NICs per node): all_reduce_bench.py
# on 4 nodes of 8x B200, busbw in GB/s, from the same README, section "all_reduce benchmark".
B200_4NODES = [
    (32 * 1024, 0.65), (64 * 1024, 1.27), (128 * 1024, 2.35), (256 * 1024, 4.06), (512 * 1024, 6.99),
    (1 * MiB, 12.47), (2 * MiB, 20.79), (4 * MiB, 31.63), (8 * MiB, 50.61), (16 * MiB, 71.80),
    (32 * MiB, 142.90), (64 * MiB, 197.77), (128 * MiB, 260.50), (256 * MiB, 283.23), (512 * MiB, 309.91),
    (1 * GiB, 365.99), (2 * GiB, 371.26), (4 * GiB, 374.66), (8 * GiB, 376.14), (16 * GiB, 376.71),
]


def isotonic(values):
    """Pool-adjacent-violators: the closest non-decreasing sequence in least squares."""
    blocks = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out = []
    for s, c in blocks:
        out += [s / c] * c
    return out


def relative_shape(sweep, n_ranks, n_nodes, bandwidth):
    factor = 2 * (n_ranks - 1) / n_ranks
    inter_steps = 2 * (n_nodes - 1)
    intra_steps = 2 * (n_ranks - 1) - inter_steps
    latency = BASE + intra_steps * ALPHA_NVLINK + inter_steps * ALPHA_NET
    raw = []
    for size, busbw in sweep:
        t = factor * size / (busbw * GB)
        if t < 2 * latency:
            continue
        raw.append((size, factor * size / (bandwidth * (t - latency))))
    plateau = raw[-1][1]
    rel = [min(1.0, e / plateau) for _, e in raw]
    fitted = isotonic(rel)
    # Keep the first and last point of each flat run (the curve is interpolated in log2(size)).
    sizes = [size for size, _ in raw]
    points = []
    for i, (size, r) in enumerate(zip(sizes, fitted)):
        same_as_prev = i > 0 and abs(fitted[i - 1] - r) < 1e-9
        same_as_next = i + 1 < len(fitted) and abs(fitted[i + 1] - r) < 1e-9
        if same_as_prev and same_as_next:
            continue
        points.append((size, r))
    return latency, points


def show(title, latency, points):
    print(f"{title}: model latency {latency / us:.1f} us")
    for size, r in points:
        print(f"  {size / MiB:10.0f} MiB  relative {r:.3f}")


if __name__ == "__main__":
    # NVLink4 line rate 450 GB/s per direction per GPU (H200/H100 datasheets).
    show("NVLink (8x H200, 1 node)", *relative_shape(H200_NODE, 8, 1, 450 * GB))
    # 8 NICs x 400 Gb/s = 400 GB/s per node, the aggregate the ring's eight channels use.
    show("Network (4 nodes x 8 B200, 8x 400G)", *relative_shape(B200_4NODES, 32, 4, 400 * GB))
