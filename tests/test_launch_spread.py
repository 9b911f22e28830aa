"""tools/launch_spread.py's arithmetic: what it reports is what the processes measured."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import launch_spread as ls  # noqa: E402


def _row(ev, py, wall, within=0.0, core=3, huge=0):
    samples = [(0.0, ev, ev, py), (0.05, ev * (1 + within), ev, py)]
    return {"event_us": ev, "host_us": ev, "python_ms": py, "mhz": None, "core": core, "huge_kb": huge,
            "steal_ticks": 1, "ticks": 10, "wall": wall, "samples": samples}


def test_summary_names_the_spread_the_correlations_and_the_cores():
    rng = random.Random()
    base = rng.uniform(300, 500)
    slow = [_row(base * f, 8 * f, w, core=c) for w, (f, c) in enumerate([(1.0, 3), (1.5, 5), (1.2, 3), (1.0, 5)])]
    text = ls.summarize({"as the grader starts them": slow}, 4, [3, 5])
    assert "| as the grader starts them | 4 | " in text and ", 50 % |" in text  # 1.5x the fastest
    assert "correlation 1.00" in text  # the launches follow the Python loop exactly here
    assert "core 3:" in text and "core 5:" in text and "steal" in text


def test_within_a_process_is_its_own_samples_spread():
    assert abs(ls.within(_row(400.0, 8.0, 0.0, within=0.25)) - 0.25) < 1e-9
    assert ls.correlation([1.0, 2.0], [2.0, 4.0]) != ls.correlation([1.0, 2.0], [2.0, 4.0])  # too few: nan
    assert abs(ls.correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) + 1) < 1e-12
