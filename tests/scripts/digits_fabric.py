"""A raw PyTorch loop on scikit-learn's digits, run through ``@nano``, ``TorchNano`` or plainly.

argv: OUT_DIR key=value ... Keys: api (nano | nano_kw | torchnano | plain), steps, batch, processes,
start_method, precision, channels_last, auto_lr, epochs. Every rank writes OUT_DIR/rank{N}.json and
its weights; the launching process writes OUT_DIR/returned.json with what the call returned.
"""

import json
import os
import sys

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import nano_patch
from nano_patch import TorchNano, nano

ARGS = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
OUT = sys.argv[1]
LAUNCHER = "LOCAL_RANK" not in os.environ  # Lightning's script re-run sets it in the ranks it starts
KNOBS = {k: ARGS[k] for k in ("precision",) if k in ARGS}
if "processes" in ARGS:
    KNOBS["num_processes"] = int(ARGS["processes"])
if "channels_last" in ARGS:
    KNOBS["channels_last"] = ARGS["channels_last"] == "1"
if "auto_lr" in ARGS:
    KNOBS["auto_lr"] = json.loads(ARGS["auto_lr"])
if "start_method" in ARGS:
    KNOBS["start_method"] = ARGS["start_method"]


SEEN = {}


def _record_conv(module, inputs, output) -> None:
    SEEN["conv_input_channels_last"] = inputs[0].is_contiguous(memory_format=torch.channels_last)
    SEEN["conv_output_dtype"] = str(output.dtype)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )
    model[2].register_forward_hook(_record_conv)
    return model


def data():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def report(model, extra) -> dict:
    r = rank()
    weights = os.path.join(OUT, f"weights{r}.pt")
    torch.save({k: v.detach().float().contiguous() for k, v in model.state_dict().items()}, weights)
    info = {"rank": r, "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
            "pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "weights": weights,
            "task_affinity": [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")],
            "patched": nano_patch.is_patched(), "nano_patch_file": nano_patch.__file__,
            "patched_by": getattr(sys.modules.get("nano_patch.train.ranks"), "patched_by", None), **extra}
    with open(os.path.join(OUT, f"rank{r}.json"), "w") as f:
        json.dump(info, f)
    return info


def loop(model, optimizer, loader, steps, loss_fn, backward=None) -> dict:
    step, lrs, seen = 0, [], {}
    for _epoch in range(int(ARGS.get("epochs", 1))):
        for x, y in loader:
            if step == steps:
                break
            optimizer.zero_grad()
            out = model(x)
            seen = dict(SEEN)  # what the second conv saw in training (before the accuracy pass below)
            loss = loss_fn(out, y)
            backward(loss) if backward else loss.backward()
            optimizer.step()
            lrs.append(optimizer.param_groups[0]["lr"])
            step += 1
    test = data()[1]
    with torch.no_grad():
        acc = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
    weights_cl = all(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)
    return {"steps": step, "accuracy": acc, "lrs": lrs, "channels_last_weights": weights_cl, **seen}


@nano(**KNOBS)
def train_nano(model, optimizer, loader, steps, loss_fn):
    return report(model, loop(model, optimizer, loader, steps, loss_fn))


class DigitsNano(TorchNano):
    def train(self, model, optimizer, loader, steps):
        model, optimizer, loader = self.setup(model, optimizer, loader)
        return report(model, loop(model, optimizer, loader, steps, torch.nn.functional.cross_entropy,
                                  backward=self.backward))


if __name__ == "__main__":
    train, _ = data()
    batch = int(ARGS.get("batch", 16))
    steps = int(ARGS.get("steps", 6))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=float(ARGS.get("lr", 0.1)), momentum=0.9)
    loader = DataLoader(train, batch_size=batch, shuffle=False)
    api = ARGS.get("api", "nano")
    loss_fn = torch.nn.CrossEntropyLoss()
    if api == "nano":
        returned = train_nano(model, optimizer, loader, steps, loss_fn)
    elif api == "nano_kw":
        returned = train_nano(loss_fn=loss_fn, steps=steps, loader=loader, optimizer=optimizer, model=model)
    elif api == "torchnano":
        returned = DigitsNano(**KNOBS).train(model, optimizer, loader, steps)
    else:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(OUT, "init.pt"))
        returned = report(model, loop(model, optimizer, loader, steps, loss_fn))
    if LAUNCHER:
        with open(os.path.join(OUT, "returned.json"), "w") as f:
            json.dump(returned, f)
