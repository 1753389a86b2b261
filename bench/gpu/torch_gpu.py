"""What the PyTorch peers in bench/gpu share: importing torch (and more modules) with a CUDA
device, or saying why not in the form run-device-check.sh reports as a skip; the device the
peers run on; synchronizing it and timing on it.

MEDLEY_TORCH_DEVICE=cpu runs a peer on the CPU instead (a smoke run of the script on a
machine without a GPU, at small sizes; its figures are not the peer's)."""
import importlib
import os
import statistics
import time

DEVICE = os.environ.get("MEDLEY_TORCH_DEVICE", "cuda")


def torch_or_skip(*more):
    """(torch, [modules of `more`]) with the device, or None after printing "SKIP: ..."."""
    try:
        torch = importlib.import_module("torch")
        mods = [importlib.import_module(m) for m in more]
    except ImportError as e:
        print(f"SKIP: {e}")
        return None
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return None
    return torch, mods


def sync(torch):
    """Wait for the device's queued work."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def device_name(torch):
    return torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE


def timed_ms(torch, fn, reps, warm=3):
    """(median, min, max) milliseconds of fn over reps runs after warm runs: CUDA events
    around each run on the GPU, the monotonic clock around fn + sync elsewhere."""
    for _ in range(warm):
        fn()
    sync(torch)
    times = []
    for _ in range(reps):
        if DEVICE == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times), max(times)


def emit(res, path):
    """Print the result's JSON and, with path, write it there too. Returns 0."""
    import json
    print(json.dumps(res))
    if path:
        with open(path, "w") as f:
            json.dump(res, f)
    return 0
