"""tools/whole_job_goals.py: the goals table reads the fastest stage-10 row against cuDNN's whole call."""

import tool_modules  # tests/ is on the path

goals = tool_modules.load("whole_job_goals")


def _row(stage, net, n, whole, total=None, floor=None):
    return {"stage": stage, "net": net, "images": n, "whole_call_s": whole, "whole_call_range": [whole, whole * 1.1],
            "whole_call_runs": 5, "whole_call_how": "how", "total_s": total or whole, "floor_fraction": floor,
            "predictions_equal": True}


def test_the_fastest_row_is_compared_with_cudnn_and_each_goal_is_judged():
    rows = [_row("10 slow", "cifar10", 50000, 9e-3), _row("10 fast", "cifar10", 50000, 7e-3, floor=0.8),
            _row("cuDNN (PyTorch)", "cifar10", 50000, 35e-3),
            _row("10 a", "ece408", 10000, 2e-3), _row("cuDNN (PyTorch)", "ece408", 10000, 4.4e-3),
            {"stage": "10 a: pipeline", "net": "cifar10", "images": 50000, "e2e_s": 16e-3, "e2e_range": [16e-3, 17e-3],
             "e2e_runs": 3, "classes_differing": 0}]
    text = goals.table(rows)
    cifar = next(line for line in text.splitlines() if line.startswith("| cifar10 50000"))
    assert "10 fast" in cifar and "7.000 ms" in cifar and "5.00×" in cifar and "80.0" in cifar and "**met**" in cifar
    ece = next(line for line in text.splitlines() if line.startswith("| ece408 10000"))
    assert "2.20×" in ece and "**not met**" in ece  # 2.2x against a goal of 2.5x
    assert "| fashion 10000 | not in this run" in text
    e2e = next(line for line in text.splitlines() if line.startswith("| 10 a: pipeline"))
    assert e2e.endswith("| not met |")  # 16 ms against 15
