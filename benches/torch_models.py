"""The models and batch sizes of benches/train_step.rs in PyTorch, bare and under
torch.nn.DataParallel(device_ids=[0]), on one CUDA device.

    python3 benches/torch_models.py [OUT.csv] [mlp resnet18 encoder]
    python3 benches/torch_models.py --profile MODEL BATCH   # kernels of 10 bare steps
    python3 benches/torch_models.py --scaling N [OUT.csv] [models]   # N GPUs, per-GPU batch

`--scaling N` keeps the per-GPU batch of the one-GPU rows and runs, per model and batch: the bare
model on one GPU, nn.DataParallel over GPUs 0..N-1 with N times the batch, and
DistributedDataParallel with one process per GPU (NCCL), each with the per-GPU batch; first,
the GPU 0 to GPU 1 copy rate at a few sizes (the bandwidth the parameter broadcast and gradient
reduce are measured against). TRAIN_STEP_BATCHES (e.g. "64") keeps only those batch sizes.

Same layouts as the Rust bench: MLP 1024-4096-4096-10; ResNet-18 (basic blocks, width 64) on
3x64x64 images; a post-norm transformer encoder (d_model 256, 8 heads, d_ff 1024, 4 layers, no
dropout, GELU) over 128 tokens from a 1000-word vocabulary, mean-pooled into 10 classes. SGD
with lr 0.01 and cross-entropy; fp32 with TF32 matmuls allowed, as Burn's CUDA backend uses.
Each configuration: 10 warm-up steps, the median of 30 timed steps (synchronised at the end of
each), and torch.cuda.max_memory_allocated. Prints a Markdown table; writes the CSV layout of
the Rust bench (backend,model,batch,config,median_ms,samples_per_s,memory_bytes).
"""

import os
import statistics
import sys
import time

import torch
from torch import nn

CLASSES, VOCAB = 10, 1000
BATCHES = {"mlp": (256, 1024), "resnet18": (64, 256), "encoder": (32, 128)}


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(3, 2, 1)
        blocks, cin = [], width
        for stage, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            blocks += [Block(cin, cout, 1 if stage == 0 else 2), Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        x = self.blocks(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Encoder(nn.Module):
    def __init__(self, d_model=256, layers=4):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, 8, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embedding(tokens)).mean(1))


def model_and_input(name, batch, device):
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
            nn.Linear(4096, CLASSES),
        )
        x = torch.randn(batch, 1024, device=device)
    elif name == "resnet18":
        model, x = ResNet18(), torch.randn(batch, 3, 64, 64, device=device)
    else:
        model, x = Encoder(), torch.randint(0, VOCAB, (batch, 128), device=device)
    return model.to(device), x


def run(name, batch, wrap, device, warm_up=10, timed=30):
    torch.manual_seed(0)
    model, x = model_and_input(name, batch, device)
    y = torch.randint(0, CLASSES, (batch,), device=device)
    if wrap:
        model = nn.DataParallel(model, device_ids=[0])
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(warm_up + timed):
        start = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optim.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warm_up:]), torch.cuda.max_memory_allocated()


def profile(name, batch, device, steps=10):
    """Prints the CUDA kernels of `steps` bare training steps, by total device time."""
    model, x = model_and_input(name, batch, device)
    y = torch.randint(0, CLASSES, (batch,), device=device)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        optim.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optim.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"torch profile: {name} batch {batch}, {steps} bare steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


def ddp_worker(rank, world, name, batch, port, results):
    """One DDP process: times steps on its GPU; rank 0 reports the median."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    device = torch.device(f"cuda:{rank}")
    torch.manual_seed(0)
    model, x = model_and_input(name, batch, device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    y = torch.randint(0, CLASSES, (batch,), device=device)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(40):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optim.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if rank == 0:
        results.put(statistics.median(times[10:]))
    dist.barrier()
    dist.destroy_process_group()
    # Leave at once: the CUDA and NCCL teardown of a spawned worker can outlast the bench.
    os._exit(0)


def p2p_bandwidth(size_bytes, repeats=20):
    """GPU 0 to GPU 1 copy rate of `size_bytes` (GB/s, median of `repeats`), with the copy's
    end synchronised on both devices, as a transfer inside a step is."""
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device="cuda:0")
    dst = torch.empty_like(src, device="cuda:1")
    times = []
    for _ in range(repeats + 3):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        times.append(time.perf_counter() - start)
    return size_bytes / statistics.median(times[3:]) / 1e9


def write_csv(out, rows):
    """Writes the rows so far (after every configuration, so a run stopped early keeps them)."""
    if out:
        with open(out, "w") as f:
            f.write("\n".join(rows) + "\n")


def batches(name):
    """The model's batch sizes, or those of them listed in TRAIN_STEP_BATCHES."""
    wanted = os.environ.get("TRAIN_STEP_BATCHES")
    if not wanted:
        return BATCHES[name]
    keep = {int(b) for b in wanted.split(",")}
    return tuple(b for b in BATCHES[name] if b in keep)


def scaling(gpus, out, models):
    import torch.multiprocessing as mp

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    print("| backend | model | per-GPU batch | configuration | median step | samples/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    if gpus > 1:
        print("GPU 0 to GPU 1 copy (torch, synchronised):", ", ".join(
            f"{mb} MB {p2p_bandwidth(mb * 10**6):.1f} GB/s" for mb in (4, 25, 47, 100, 400)))
    rows = ["backend,model,batch,config,median_ms,samples_per_s,memory_bytes"]
    context = mp.get_context("spawn")
    for name in models:
        for batch in batches(name):
            one, _ = run(name, batch, False, torch.device("cuda:0"))
            dp, _ = run_dp(name, batch, gpus)
            results = context.SimpleQueue()
            mp.spawn(ddp_worker, args=(gpus, name, batch, 29500 + batch, results), nprocs=gpus)
            ddp = results.get()
            configs = [
                ("bare 1 GPU", one, batch),
                (f"DataParallel {gpus} GPUs", dp, batch * gpus),
                (f"DDP {gpus} GPUs", ddp, batch * gpus),
            ]
            if name == "resnet18":
                # nn.DataParallel runs replicas on fresh threads every step, and cuDNN's
                # benchmark results do not carry over to them: also without benchmarking.
                torch.backends.cudnn.benchmark = False
                plain, _ = run_dp(name, batch, gpus)
                torch.backends.cudnn.benchmark = True
                configs.insert(2, (f"DataParallel {gpus} GPUs cudnn.benchmark off", plain,
                                   batch * gpus))
            for config, median, total in configs:
                rate, base = total / median, batch / one
                print(
                    f"| torch | {name} | {batch} | {config} | {median * 1e3:.3f} ms | "
                    f"{rate:.0f} | {rate / base:.2f}x |"
                )
                rows.append(f"torch,{name},{total},{config},{median * 1e3:.4f},{rate:.1f},")
            write_csv(out, rows)


def run_dp(name, batch, gpus, warm_up=10, timed=30):
    """nn.DataParallel over GPUs 0..gpus-1 with `gpus` times the per-GPU batch."""
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    model, x = model_and_input(name, batch * gpus, device)
    y = torch.randint(0, CLASSES, (batch * gpus,), device=device)
    model = nn.DataParallel(model, device_ids=list(range(gpus)))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(warm_up + timed):
        start = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optim.step()
        for d in range(gpus):
            torch.cuda.synchronize(d)
        times.append(time.perf_counter() - start)
    return statistics.median(times[warm_up:]), None


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--scaling":
        rest = sys.argv[3:]
        out = next((a for a in rest if a.endswith(".csv")), None)
        models = [a for a in rest if a in BATCHES] or list(BATCHES)
        scaling(int(sys.argv[2]), out, models)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--profile":
        torch.backends.cuda.matmul.allow_tf32 = True
        profile(sys.argv[2], int(sys.argv[3]), torch.device("cuda:0"))
        return
    out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".csv") else None
    models = [a for a in sys.argv[1:] if a in BATCHES] or list(BATCHES)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda:0")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| backend | model | batch | configuration | median step | samples/s | vs bare | memory |")
    print("|---|---|---|---|---|---|---|---|")
    rows = ["backend,model,batch,config,median_ms,samples_per_s,memory_bytes"]
    for name in models:
        for batch in batches(name):
            bare = None
            for config, wrap in (("bare", False), ("DataParallel x1", True)):
                median, memory = run(name, batch, wrap, device)
                bare = bare or median
                print(
                    f"| torch | {name} | {batch} | {config} | {median * 1e3:.3f} ms | "
                    f"{batch / median:.0f} | {median / bare:.3f}x | {memory / 2**30:.2f} GiB |"
                )
                rows.append(
                    f"torch,{name},{batch},{config},{median * 1e3:.4f},{batch / median:.1f},{memory}"
                )
                write_csv(out, rows)


if __name__ == "__main__":
    main()
