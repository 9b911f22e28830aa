"""labkit.plots: headless, returns Figures with the bars the data calls for."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from labkit import nets, plots  # noqa: E402
from labkit.timing import Ledger, RunReport  # noqa: E402

CIFAR_LAYERS = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3", "flatten", "fc",
                "softmax"]


def report(stage, scale, images=1200, device="GPU X"):
    secs = {name: scale * (1.0 if name.startswith("conv") else 0.01) for name in CIFAR_LAYERS}
    return RunReport("cifar10", images, secs, accuracy=0.5, device=device, simulated=False, stage=stage)


def bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_layer_bars_one_report():
    fig = plots.layer_bars(report("01_serial", 1.0))
    assert isinstance(fig, Figure)
    assert len(bars(fig.axes[0])) == 11  # flatten folded into fc


def test_layer_bars_side_by_side_and_share():
    reports = [report("01_serial", 1.0), report("04_data", 0.1), report("05_shared", 0.01)]
    fig = plots.layer_bars(reports)
    ax = fig.axes[0]
    assert len(bars(ax)) == 3 * 11
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["01_serial", "04_data", "05_shared"]
    fig = plots.layer_bars(reports, share=True)
    heights = [b.get_height() for b in bars(fig.axes[0])]
    assert sum(heights) == pytest.approx(300.0)  # each report sums to 100 %
    assert "%" in fig.axes[0].get_ylabel()


def test_layer_bars_on_given_axes():
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    assert plots.layer_bars(report("x", 1.0), ax=b) is fig
    assert len(bars(b)) == 11 and len(bars(a)) == 0
    plt.close(fig)


def test_stage_ladder_from_reports():
    reports = [report("02_parallel", 0.5), report("01_serial", 1.0), report("05_shared", 0.01),
               report("05_shared", 0.02, images=50000)]
    fig = plots.stage_ladder(reports, "cifar10")
    ax = fig.axes[0]
    assert len(bars(ax)) == 2 * 3  # total and conv for 3 stages at 1200 images
    assert [t.get_text() for t in ax.get_xticklabels()] == ["01_serial", "02_parallel", "05_shared"]
    notes = [t.get_text() for t in ax.texts]
    assert notes[0] == "x1" and notes[-1] == "x100"
    assert ax.get_yscale() == "log"
    assert len(bars(plots.stage_ladder(reports, "cifar10", images=50000, log=False).axes[0])) == 2


def test_stage_ladder_from_ledger_keeps_newest_run_per_stage(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    ledger.record(report("01_serial", 1.0))
    ledger.record(report("05_shared", 0.05))
    ledger.record(report("05_shared", 0.01))  # newer: this one counts
    ledger.record(report("05_shared", 0.001, device="other GPU"))  # another machine, left out
    ledger.record(report("05_shared", 0.01, device="GPU X"))
    fig = plots.stage_ladder(ledger.read(), "cifar10")
    ax = fig.axes[0]
    assert len(bars(ax)) == 4
    totals, convs = [b.get_height() for b in bars(ax)][:2], [b.get_height() for b in bars(ax)][2:]
    assert totals == pytest.approx([report("x", 1.0).total, report("x", 0.01).total])
    assert convs == pytest.approx([3.0, 0.03])
    with pytest.raises(ValueError, match="fashion"):
        plots.stage_ladder(ledger.read(), "fashion")
    # a notebook on the simulator asks with its scaled net's name; results file under the full net's
    mini = nets.CIFAR10.scaled((8, 8), max_channels=4)
    assert len(bars(plots.stage_ladder(ledger.read(), mini).axes[0])) == 4


def test_roofline_and_save(tmp_path):
    points = [("conv1 naive", 2e9, 4e9, 0.01), ("conv1 tiled", 2e9, 2e8, 0.001)]
    fig = plots.roofline(points, peak_flops=60e12, peak_bandwidth=3e12)
    ax = fig.axes[0]
    assert len(ax.collections) == 2 and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.texts] == ["conv1 naive", "conv1 tiled"]
    path = plots.save(fig, tmp_path / "figs" / "roof")
    assert path.name == "roof.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        plots.save(fig, tmp_path / "x.jpg")
    with pytest.raises(ValueError):
        plots.roofline(points, 0, 1)
