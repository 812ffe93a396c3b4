"""A plain PyTorch loop on scikit-learn's digits: no Lightning, no nano_patch import.

argv: OUT_DIR. Writes OUT_DIR/plain.json with the dtype and memory format the convolution saw.
"""

import json
import os
import sys

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

seen = {}


def watch(module, inputs, output):
    seen["input_channels_last"] = inputs[0].is_contiguous(memory_format=torch.channels_last)
    seen["output_dtype"] = str(output.dtype)


if __name__ == "__main__":
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    data = TensorDataset(x[:256], torch.tensor(digits.target[:256]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))
    model[2].register_forward_hook(watch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for xb, yb in DataLoader(data, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    with open(os.path.join(sys.argv[1], "plain.json"), "w") as f:
        json.dump(seen, f)
