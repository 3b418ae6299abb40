"""torch.cat / torch.split on the shapes of benches/concat.rs, timed with CUDA events.

    python3 benches/torch_concat.py

Each measurement is the median of 7 samples of 10 operations between two CUDA events; the
bytes counted are those read and written (twice the output). The small case also reports one
operation timed alone.
"""

import statistics

import torch

CASES = [
    ("4x[16384,4096] f32", 4, (16384, 4096), torch.float32),
    ("8x[8192,4096] f32", 8, (8192, 4096), torch.float32),
    ("4x[16384,4096] bf16", 4, (16384, 4096), torch.bfloat16),
    ("4x[64,1024] f32", 4, (64, 1024), torch.float32),
]


def time_ms(op, repeat):
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    samples = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            op()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / repeat)
    return statistics.median(samples)


def main():
    print("| backend | case | method | time | bandwidth (read + write) |")
    print("|---|---|---|---|---|")
    for name, count, (rows, cols), dtype in CASES:
        parts = [torch.full((rows, cols), float(i), device="cuda", dtype=dtype) for i in range(count)]
        whole = torch.cat(parts, 0)
        columns = torch.cat(parts, 1)
        nbytes = 2 * whole.numel() * whole.element_size()

        def report(method, ms):
            print(f"| PyTorch {torch.__version__} | {name} | {method} | {ms:.3f} ms | {nbytes / ms / 1e9:.2f} TB/s |")

        report("torch.cat", time_ms(lambda: torch.cat(parts, 0), 10))
        report("copy ceiling (clone)", time_ms(lambda: whole.clone(), 10))
        report("torch.split, dim 1 + contiguous", time_ms(lambda: [p.contiguous() for p in torch.split(columns, cols, 1)], 10))
        if rows * cols * count <= 1 << 20:
            report("torch.cat, 1 op", time_ms(lambda: torch.cat(parts, 0), 1))


if __name__ == "__main__":
    main()
