"""labkit.plots: headless, returns Figures with the bars the data calls for."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from labkit import ceilings, plots  # noqa: E402
from labkit.ledger import Ledger  # noqa: E402
from labkit.report import RunReport  # noqa: E402

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


def test_stage_ladder_from_reports_in_course_order():
    reports = [report("02 parallel", 0.5), report("cuDNN", 0.001), report("01 serial", 1.0),
               report("05 shared", 0.01), report("05 shared", 0.02, images=50000)]
    fig = plots.stage_ladder(reports, "cifar10")
    ax = fig.axes[0]
    assert len(bars(ax)) == 2 * 4  # total and conv for 4 runs at 1200 images
    assert [t.get_text() for t in ax.get_xticklabels()] == ["01 serial", "02 parallel", "05 shared", "cuDNN"]
    notes = [t.get_text() for t in ax.texts]
    assert notes[0] == "x1" and notes[2] == "x100"  # speedups over the first stage: no numpy reference here
    assert ax.get_yscale() == "log"
    assert len(bars(plots.stage_ladder(reports, "cifar10", images=50000, log=False).axes[0])) == 2


def test_stage_ladder_speedups_are_over_the_numpy_reference_when_it_ran():
    reports = [report("01 serial", 1.0), report("numpy reference", 0.1), report("04 batched", 0.01)]
    notes = [t.get_text() for t in plots.stage_ladder(reports, "cifar10").axes[0].texts]
    assert notes == ["x0.1", "x10", "x1"]  # 01, 04, then the reference itself


def test_stage_ladder_from_ledger_keeps_newest_run_per_stage(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl", one_device=False)  # lines of two machines, as the default ledger may hold
    ledger.record(report("01 serial", 1.0))
    ledger.record(report("05 shared", 0.05))
    ledger.record(report("05 shared", 0.01))  # newer: this one counts
    ledger.record(report("05 shared", 0.001, device="other GPU"))  # another machine, left out
    ledger.record(report("05 shared", 0.01, device="GPU X"))
    fig = plots.stage_ladder(ledger.read(), "cifar10")
    ax = fig.axes[0]
    assert len(bars(ax)) == 4
    totals, convs = [b.get_height() for b in bars(ax)][:2], [b.get_height() for b in bars(ax)][2:]
    assert totals == pytest.approx([report("x", 1.0).total, report("x", 0.01).total])
    assert convs == pytest.approx([3.0, 0.03])
    with pytest.raises(ValueError, match="fashion"):
        plots.stage_ladder(ledger.read(), "fashion")


def test_roofline_and_save(tmp_path):
    points = [("conv1 naive", 2e9, 4e9, 0.01), ("conv1 tiled", 2e9, 2e8, 0.001)]
    fig = plots.roofline(points, peak_flops=60e12, peak_bandwidth=3e12)
    ax = fig.axes[0]
    assert len(ax.collections) == 1 and ax.get_xscale() == "log"  # one series
    assert [t.get_text() for t in ax.texts] == ["conv1 naive", "conv1 tiled"]
    path = plots.save(fig, tmp_path / "figs" / "roof")
    assert path.name == "roof.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        plots.save(fig, tmp_path / "x.jpg")
    with pytest.raises(ValueError):
        plots.roofline(points, 0, 1)


def test_roofline_of_runs_one_series_per_run_under_the_ceilings():
    roof = ceilings.Ceilings("GPU X", 60e12, 3e12, "datasheet")
    fig = plots.roofline_runs([report("04 a", 1.0), report("05 b", 0.1)], roof)
    ax = fig.axes[0]
    assert len(ax.collections) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["04 a", "05 b"]
    assert [t.get_text() for t in ax.texts] == ["conv1", "conv2", "conv3"] * 2
    assert "datasheet" in ax.get_title() and roof.ridge == 20
    ys = [p[1] for p in ax.collections[1].get_offsets()]
    assert ys[0] == pytest.approx(10 * [p[1] for p in ax.collections[0].get_offsets()][0])  # 10x faster run


def test_scaling_and_per_image_bars():
    reps = [report("03 managed", 1.0, images=1200), report("03 managed", 20.0, images=50000),
            report("03 explicit", 0.5, images=1200)]
    ax = plots.scaling(reps).axes[0]
    assert len(ax.lines) == 2 and ax.get_xscale() == "log"
    (managed,) = [ln for ln in ax.lines if ln.get_label() == "03 managed"]
    assert list(managed.get_xdata()) == [1200, 50000] and managed.get_linestyle() == "--"

    class Run:
        def __init__(self, rep):
            self.report = rep

    fig = plots.per_image_bars({"a": Run(reps[0]), "b": Run(reps[1])})
    heights = sorted(b.get_height() for b in bars(fig.axes[0]))
    assert heights[-1] == pytest.approx(1.0 / 1200)  # a conv layer of run a, per image
    assert any(h == pytest.approx(20.0 / 50000) for h in heights)  # and of run b


def test_layer_bars_log_scale_and_a_bounded_width_for_many_runs():
    reports = [report(f"0{i} v", 10.0 ** -i) for i in range(8)]
    fig = plots.layer_bars(reports, log=True)
    assert fig.axes[0].get_yscale() == "log" and len(bars(fig.axes[0])) == 8 * 11
    assert fig.get_figwidth() <= 18
    assert plots.layer_bars(reports[:2]).axes[0].get_yscale() == "linear"
