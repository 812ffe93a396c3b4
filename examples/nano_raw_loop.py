"""A raw PyTorch training loop on scikit-learn's digits, accelerated by ``@nano``.

    python examples/nano_raw_loop.py                      # @nano: 2 pinned processes, bf16, channels-last
    python examples/nano_raw_loop.py --stock              # the same loop, plain PyTorch
    python examples/nano_raw_loop.py --processes 1 --precision 32

The loop itself is unchanged plain PyTorch: ``loss.backward()`` and ``optimizer.step()``. Under
``@nano`` each process trains on its shard of every epoch, so the global batch is processes x batch.
"""

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def digits():
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10),
    )


def train(model, optimizer, loader, epochs):
    """Plain PyTorch: nothing here knows about nano-patch."""
    start, seen = time.perf_counter(), 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            seen += len(y)
    return seen / (time.perf_counter() - start), model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stock", action="store_true")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    train_set, test_set = digits()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    run = train
    if not args.stock:
        from nano_patch import nano

        run = nano(num_processes=args.processes, precision=args.precision, channels_last=True)(train)
    rate, model = run(model, optimizer, loader, args.epochs)
    with torch.no_grad():
        acc = (model(test_set.tensors[0]).argmax(1) == test_set.tensors[1]).float().mean().item()
    print(f"{'stock' if args.stock else '@nano'}: {rate:.0f} samples/s per process, test accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
