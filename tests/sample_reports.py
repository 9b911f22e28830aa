"""A report of the cifar10 network with known per-layer seconds, for the report and ledger tests."""

from labkit.report import RunReport

CIFAR_SECONDS = {"conv1": 0.113322, "relu1": 0.0004, "pool1": 0.03, "conv2": 0.092, "relu2": 0.0003,
                 "pool2": 0.02, "conv3": 0.061, "relu3": 0.0003, "pool3": 0.015, "flatten": 0.0,
                 "fc": 0.001, "softmax": 0.0001}


def cifar_report(**kw) -> RunReport:
    args = dict(net="cifar10", images=1200, layer_seconds=dict(CIFAR_SECONDS), accuracy=0.7825,
                device="Tesla V100-PCIE-32GB", simulated=False, synthetic=False, stage="05_shared",
                method="cuda-events", runs=3, total_range=(0.3, 0.4))
    args.update(kw)
    return RunReport(**args)
