"""PyTorch's device copy of 1 GiB, the yardstick for `ropekv bench`'s copy ceiling.

Runs on the GPU machine's own python3 (torch only). Times `b.copy_(a)` (uint8, then the same bytes
as int64) and `torch.add(a, 0, out=b)` with CUDA events: 5 warm-up calls, then 30 timed calls,
three times each. GB/s count read + write (2 GiB per 1 GiB copy), as the bench's copy rows do.
"""
import torch

n_bytes = 1 << 30
a = torch.empty(n_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
b = torch.empty_like(a)
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def rate(fn, calls=30, warm=5):
    for _ in range(warm):
        fn()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(stop) * 1000.0 / calls
    return 2.0 * n_bytes / (us * 1e-6) / 1e9, us


a64, b64 = a.view(torch.int64), b.view(torch.int64)
rows = [("copy_ u8", lambda: b.copy_(a)),
        ("copy_ as i64", lambda: b64.copy_(a64)),
        ("add(a, 0, out=b) i64", lambda: torch.add(a64, 0, out=b64))]
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
for name, fn in rows:
    runs = [rate(fn) for _ in range(3)]
    print(f"{name:22s} " + " / ".join(f"{gbs:.1f} GB/s ({us:.0f} us)" for gbs, us in runs))
