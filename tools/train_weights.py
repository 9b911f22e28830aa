"""Train the kit's shipped weights (maintainers only; needs the `train` extra: PyTorch).

    python tools/train_weights.py --net all

Builds a PyTorch model from the labkit spec itself, so its parameters are exactly the npz keys
(`conv1.weight`, `conv1.bias`, ..., `fc.weight`), trains it on the inputs `labkit.data.to_input` makes, saves
`labkit/weights/<net>.npz` with `labkit.weights_io.save_weights`, reloads the file with `labkit.weights_io.load_weights` and
records in `<net>.json` the recipe, the provenance and accuracies computed by `labkit.reference` on the weights
as loaded (float16 layers upcast), never PyTorch's figures.

labkit itself never imports torch; only this script does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import shlex
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - maintainer tool
    sys.exit("tools/train_weights.py needs PyTorch: pip install -e '.[train]'")
from tqdm import tqdm

import labkit
from labkit import reference
from labkit.data import load_cifar10, load_fashion, to_input
from labkit.nets import Net, get_net
from labkit.weights_io import WEIGHTS_DIR, load_weights, save_weights

# Arrays above this many elements are stored as float16: only fashion's fc1 (160 x 20184 = 3.2 M) crosses it,
# which keeps the shipped files under 10 MB in all. Everything else stays float32.
FLOAT16_ABOVE = 100_000
SIZE_LIMIT = 10 * 1024 * 1024

COMPUTED_BY = ("labkit.reference.forward + labkit.reference.accuracy on the weights as loaded by "
               "labkit.weights_io.load_weights (float16-stored layers upcast to float32)")

# One recipe per net. Epoch counts fit a 2-core CPU (measured unloaded: ~22 s per cifar10 epoch, ~2 min per
# fashion epoch). fashion: a first run (Adam 2e-3, batch 128, 4 epochs) reached only 0.8755; in 2-epoch trials on
# 12000 images, batch 64 with lr 1e-3 did best, so the recipe takes more, smaller steps.
RECIPES = {
    "cifar10": {
        "optimizer": "SGD(momentum=0.9, nesterov=True, weight_decay=5e-4 on all parameters)",
        "optimizer_name": "sgd",
        "lr": 0.05,
        "weight_decay": 5e-4,
        "lr_schedule": "OneCycleLR per step: max_lr 0.05, pct_start 0.25, cosine annealing, div_factor 25, "
                       "final_div_factor 1e4",
        "batch_size": 128,
        "epochs": 20,
        "augmentation": "random 32x32 crop from the input zero-padded by 4 (zero = mid-grey after byte/255-0.5), "
                        "horizontal flip with p=0.5",
        "loss": "cross-entropy on the logits (= the spec's softmax + negative log-likelihood)",
        "init": "PyTorch default (kaiming-uniform, a=sqrt(5))",
        "train": {"dataset": "cifar10", "split": "train", "count": 50000},
        "eval": {"dataset": "cifar10", "split": "test", "count": 1000},
    },
    "fashion": {
        "optimizer": "Adam(betas=(0.9, 0.999), weight_decay=0), beta1 cycled 0.95->0.85->0.95 by OneCycleLR",
        "optimizer_name": "adam",
        "lr": 1e-3,
        "weight_decay": 0.0,
        "lr_schedule": "OneCycleLR per step: max_lr 1e-3, pct_start 0.25, cosine annealing, div_factor 25, "
                       "final_div_factor 1e4",
        "batch_size": 64,
        "epochs": 6,
        "augmentation": "none",
        "loss": "cross-entropy on the logits (= the spec's softmax + negative log-likelihood)",
        "init": "PyTorch default (kaiming-uniform, a=sqrt(5))",
        "train": {"dataset": "fashion", "split": "train", "count": 60000},
        "eval": {"dataset": "fashion", "split": "test", "count": 10000},
    },
}

# What the JSON reports: (images, split), each computed by labkit.reference on exactly that many first images.
REPORTED = {
    "cifar10": [(1200, "train"), (50000, "train"), (1000, "test")],
    "fashion": [(100, "test"), (1000, "test"), (10000, "test")],
}


# ----------------------------------------------------------------------------------------------- the model


def logits_layer(net: Net) -> str:
    """The last layer before the final softmax: what the torch model outputs."""
    names = [layer.name for layer in net.layers]
    return names[-2] if net.layers[-1].kind == "softmax" else names[-1]


def build_model(net: Net) -> nn.Sequential:
    """A torch model whose module names are the spec's layer names, so ``state_dict`` keys are the npz keys."""
    modules: OrderedDict[str, nn.Module] = OrderedDict()
    shape = tuple(net.input_shape)
    shapes = net.shapes()
    for i, layer in enumerate(net.layers):
        if layer.kind == "conv":
            modules[layer.name] = nn.Conv2d(shape[0], layer.out, layer.kernel, stride=layer.stride,
                                            padding=layer.pad, bias=layer.bias)
        elif layer.kind == "fc":
            modules[layer.name] = nn.Linear(int(np.prod(shape)), layer.out, bias=layer.bias)
        elif layer.kind == "relu":
            modules[layer.name] = nn.ReLU()
        elif layer.kind == "tanh":
            modules[layer.name] = nn.Tanh()
        elif layer.kind == "pool":
            modules[layer.name] = nn.MaxPool2d(layer.kernel, layer.stride)
        elif layer.kind == "flatten":
            modules[layer.name] = nn.Flatten()  # C,H,W order, as labkit.reference.flatten
        elif layer.kind == "softmax":
            if i != len(net.layers) - 1:
                raise ValueError(f"{net.name}: softmax must be the last layer to be folded into the loss")
            continue  # the loss applies it
        else:  # pragma: no cover - Layer validates kinds
            raise ValueError(f"no torch module for layer kind {layer.kind!r}")
        shape = shapes[layer.name]
    model = nn.Sequential(modules)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if got != net.weight_shapes():
        raise AssertionError(f"torch parameters {got} do not map one-to-one to {net.weight_shapes()}")
    return model


def model_weights(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().astype(np.float32).copy() for k, v in model.state_dict().items()}


def check_mapping(net: Net, model: nn.Module, x: np.ndarray) -> float:
    """The torch logits must equal labkit.reference's on the same float32 weights: guards the key/layout mapping."""
    model.eval()
    with torch.no_grad():
        ours = model(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    ref = reference.forward(net, model_weights(model), x, upto=logits_layer(net))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4,
                               err_msg=f"{net.name}: torch model and labkit.reference disagree")
    return float(np.abs(ours - ref).max())


# -------------------------------------------------------------------------------------------------- data


def training_data(net: Net, limit: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    recipe = RECIPES[net.name]
    n_train = limit or recipe["train"]["count"]
    n_eval = min(limit or recipe["eval"]["count"], recipe["eval"]["count"])
    if net.dataset == "cifar10":
        train, test = load_cifar10(n_train, "train"), load_cifar10(n_eval, "test")
    else:
        train, test = load_fashion(n_train, "train"), load_fashion(n_eval, "test")
    return to_input(net, train), train.labels, to_input(net, test), test.labels


def random_crop_flip(x: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Per-image random crop (from the zero-padded batch) and horizontal flip, vectorized."""
    n, c, h, w = x.shape
    xp = nn.functional.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    rows = (oy[:, None] + torch.arange(h))[:, None, :, None]
    cols = ox[:, None] + torch.arange(w)
    flip = torch.rand(n, generator=gen) < 0.5
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, None, :]
    return xp[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]


# ---------------------------------------------------------------------------------------------- training


def make_optimizer(model: nn.Module, recipe: dict, epochs: int, steps_per_epoch: int):
    if recipe["optimizer_name"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=recipe["lr"], momentum=0.9, nesterov=True,
                              weight_decay=recipe["weight_decay"])
    else:
        opt = torch.optim.Adam(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe["lr"], total_steps=epochs * steps_per_epoch,
                                                pct_start=0.25, anneal_strategy="cos", div_factor=25,
                                                final_div_factor=1e4)
    return opt, sched


def torch_eval(model: nn.Module, x: np.ndarray, y: np.ndarray, bs: int = 1000) -> float:
    """Progress display only; the recorded figures come from labkit.reference."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), bs):
            correct += int((model(torch.from_numpy(x[i:i + bs])).argmax(1).numpy() == y[i:i + bs]).sum())
    return correct / len(x)


def train(net: Net, epochs: int, seed: int, limit: int | None) -> tuple[nn.Module, dict]:
    recipe = RECIPES[net.name]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    x_train, y_train, x_eval, y_eval = training_data(net, limit)
    prep_s = time.perf_counter() - t0
    print(f"{net.name}: {len(x_train)} training inputs {x_train.shape[1:]} prepared by labkit.data.to_input "
          f"in {prep_s:.1f} s")
    model = build_model(net)
    check_mapping(net, model, x_eval[:8])  # before training too: fail fast, not after half an hour
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    bs = recipe["batch_size"]
    steps = (len(xt) + bs - 1) // bs
    opt, sched = make_optimizer(model, recipe, epochs, steps)
    loss_fn = nn.CrossEntropyLoss()
    log = []
    eval_s = 0.0  # the per-epoch display evaluation, not counted as training time
    t_train = time.perf_counter()
    for epoch in range(1, epochs + 1):
        model.train()
        t_ep = time.perf_counter()
        perm = torch.randperm(len(xt), generator=gen)
        total, seen = 0.0, 0
        bar = tqdm(range(steps), desc=f"{net.name} epoch {epoch}/{epochs}", unit="batch", leave=False)
        for s in bar:
            idx = perm[s * bs:(s + 1) * bs]
            xb, yb = xt[idx], yt[idx]
            if net.dataset == "cifar10":
                xb = random_crop_flip(xb, 4, gen)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            seen += len(idx)
            if s % 20 == 0:
                bar.set_postfix(loss=f"{total / seen:.4f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        bar.close()
        ep_s = time.perf_counter() - t_ep
        log.append({"epoch": epoch, "train_loss": round(total / seen, 5), "seconds": round(ep_s, 1)})
        t_eval = time.perf_counter()
        print(f"{net.name} epoch {epoch}/{epochs}: loss {total / seen:.4f}, {ep_s:.0f} s, "
              f"torch eval accuracy on the first {min(len(x_eval), 2000)} {recipe['eval']['split']} images "
              f"{torch_eval(model, x_eval[:2000], y_eval[:2000]):.4f} (display only)")
        eval_s += time.perf_counter() - t_eval
    train_s = time.perf_counter() - t_train - eval_s
    max_diff = check_mapping(net, model, x_eval[:16])
    print(f"{net.name}: torch logits match labkit.reference (max |diff| {max_diff:.2e}); trained in {train_s:.0f} s")
    info = {"training_wall_time_s": round(train_s, 1), "data_preparation_s": round(prep_s, 1),
            "epoch_log": log, "mapping_check_max_abs_logit_diff": max_diff,
            "train_count": len(x_train)}
    return model, info


# ----------------------------------------------------------------------------------------- record & check


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reference_accuracy(net: Net, weights: dict[str, np.ndarray], n: int, split: str) -> float:
    """Exactly what tests/test_weights.py recomputes: the first ``n`` images of ``split``, labkit's pipeline."""
    images = load_cifar10(n, split) if net.dataset == "cifar10" else load_fashion(n, split)
    return reference.accuracy(reference.forward(net, weights, to_input(net, images)), images.labels)


def record(net: Net, model: nn.Module, info: dict, out: Path, epochs: int, seed: int, limit: int | None) -> dict:
    path = out / f"{net.name}.npz"
    trained = model_weights(model)
    save_weights(path, net, trained, float16_above=FLOAT16_ABOVE)
    loaded = load_weights(net, path)  # what every figure below comes from
    assert all(loaded[k].dtype == np.float32 for k in loaded)
    recipe = {k: v for k, v in RECIPES[net.name].items() if k not in ("train", "eval", "optimizer_name")}
    recipe["epochs"] = epochs
    tr = dict(RECIPES[net.name]["train"], count=info["train_count"],
              preprocessing=f"labkit.data.to_input({net.name!r}, ...)")
    accuracies = []
    for n, split in REPORTED[net.name]:
        if limit and n > limit:
            continue
        t0 = time.perf_counter()
        value = reference_accuracy(net, loaded, n, split)
        print(f"{net.name}: labkit.reference accuracy on the first {n} {split} images: {value:.4f} "
              f"({time.perf_counter() - t0:.0f} s)")
        accuracies.append({"dataset": net.dataset, "split": split, "images": n, "value": value,
                           "computed_by": COMPUTED_BY})
    float16 = sorted(k for k, v in trained.items() if v.size > FLOAT16_ABOVE)
    doc = {
        "net": net.name,
        "file": path.name,
        "sha256": sha256(path),
        "bytes": path.stat().st_size,
        "storage": {"float16_above": FLOAT16_ABOVE, "float16_arrays": float16,
                    "note": "arrays with more elements than float16_above are stored as float16 and upcast to "
                            "float32 by labkit.weights_io.load_weights"},
        "recipe": recipe,
        "seed": seed,
        "training_data": tr,
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                     "labkit": getattr(labkit, "__version__", "unknown")},
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        "machine": f"{platform.machine()} {platform.system()}, CPU, {torch.get_num_threads()} threads",
        "training_wall_time_s": info["training_wall_time_s"],
        "data_preparation_s": info["data_preparation_s"],
        "epoch_log": info["epoch_log"],
        "mapping_check": {"max_abs_logit_diff_torch_vs_labkit_reference": info["mapping_check_max_abs_logit_diff"],
                          "images": 16},
        "accuracies": accuracies,
    }
    if limit:
        doc["smoke_test_limit"] = limit
    path.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def check_size(out: Path) -> int:
    total = sum(p.stat().st_size for p in out.glob("*.npz"))
    print(f"weights in {out}: {total / 1e6:.2f} MB in all (limit {SIZE_LIMIT / 1e6:.2f} MB)")
    if total >= SIZE_LIMIT:
        raise SystemExit(f"shipped weights total {total} bytes, over the {SIZE_LIMIT}-byte limit; lower FLOAT16_ABOVE")
    return total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--net", choices=["cifar10", "fashion", "all"], default="all")
    ap.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs (cifar10 20, fashion 6)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR, help=f"output folder (default {WEIGHTS_DIR})")
    ap.add_argument("--limit", type=int, default=None,
                    help="smoke test only: train and evaluate on the first N images (never for shipped weights)")
    args = ap.parse_args(argv)

    torch.set_num_threads(2)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    names = ["cifar10", "fashion"] if args.net == "all" else [args.net]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for name in names:
        net = get_net(name)
        epochs = args.epochs or RECIPES[name]["epochs"]
        model, info = train(net, epochs, args.seed, args.limit)
        doc = record(net, model, info, args.out, epochs, args.seed, args.limit)
        print(f"wrote {args.out / doc['file']} ({doc['bytes'] / 1e6:.2f} MB) and {name}.json")
    check_size(args.out)
    print(f"done in {(time.perf_counter() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
