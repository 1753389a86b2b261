"""What the PyTorch peers in bench/gpu share: importing torch (and more modules) with a CUDA
device, or saying why not in the form run-device-check.sh reports as a skip."""
import importlib


def torch_or_skip(*more):
    """(torch, [modules of `more`]) with a CUDA device, or None after printing "SKIP: ..."."""
    try:
        torch = importlib.import_module("torch")
        mods = [importlib.import_module(m) for m in more]
    except ImportError as e:
        print(f"SKIP: {e}")
        return None
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return None
    return torch, mods


def emit(res, path):
    """Print the result's JSON and, with path, write it there too. Returns 0."""
    import json
    print(json.dumps(res))
    if path:
        with open(path, "w") as f:
            json.dump(res, f)
    return 0
