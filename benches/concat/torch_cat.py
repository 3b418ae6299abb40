"""PyTorch's `torch.cat` and a copy of the same bytes, for the cases of `benches/concat`.

    python3 benches/concat/torch_cat.py [--device cuda:0]

The same shapes as the Rust bench (f32 rows of 1024 columns, fewer for small sizes, uneven rows, 2/4/8 inputs,
4 KiB to 256 MiB), the same method: the two operations alternate (order rotating) for 7
rounds after a warm-up, a sample is 20 calls between two device syncs; median time per call,
the rounds' range, and the rate (bytes read and written per second).
"""
import argparse
import statistics
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda:0")
parser.add_argument("--sizes-kib", default="4,64,1024,16384,262144")
parser.add_argument("--parts", default="2,4,8")
parser.add_argument("--cols", type=int, default=1024)
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--iters", type=int, default=20)
args = parser.parse_args()
device = torch.device(args.device)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample(op, iters):
    """Time per call of `op(k)` for k in 0..iters (each call on inputs of its own, as the
    Rust bench: the same cache footprint)."""
    sync()
    start = time.perf_counter()
    outputs = [op(k) for k in range(iters)]
    sync()
    del outputs
    return (time.perf_counter() - start) / iters


print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else device}, torch {torch.__version__}")
print(f"{'KiB':>10} {'parts':>5} | {'torch.cat ms (range) GB/s':>28} {'copy ms (range) GB/s':>28}")
for kib in map(int, args.sizes_kib.split(",")):
    for parts in map(int, args.parts.split(",")):
        cols = max(min(args.cols, kib * 1024 // 4 // parts), 1)
        rows = max(kib * 1024 // 4 // cols, parts)
        sizes = [rows // parts + (1 if i < rows % parts else 0) for i in range(parts)]
        pieces = [[torch.rand(r, cols, device=device) for r in sizes] for _ in range(args.iters)]
        wholes = [torch.rand(rows, cols, device=device) for _ in range(args.iters)]
        ops = [lambda k: torch.cat(pieces[k], 0), lambda k: wholes[k].clone()]
        times = [[], []]
        for rnd in range(args.rounds + 1):
            for k in range(2):
                index = (k + rnd) % 2
                t = sample(ops[index], args.iters)
                if rnd > 0:
                    times[index].append(t)
        nbytes = 2 * rows * cols * 4
        cells = []
        for samples in times:
            mid = statistics.median(samples)
            cells.append(f"{mid * 1e3:.4f} ({min(samples) * 1e3:.4f}-{max(samples) * 1e3:.4f}) {nbytes / mid / 1e9:.1f}")
        print(f"{kib:>10} {parts:>5} | {cells[0]:>28} {cells[1]:>28}")
