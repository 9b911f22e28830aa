"""tools/tune_workload.py and tools/recheck_candidate.py: the tuner of one more size refuses, in one line, a machine
without a GPU (nothing to time); the recheck runs a stage-09 candidate's group check as often as asked, names an
unknown candidate with the known ones, and fails when a check fails."""

import pytest

from labkit import stages

import tool_modules  # noqa: E402  (tests/ is on the path)

_tool = tool_modules.load


def test_tune_workload_refuses_without_a_gpu(capsys):
    assert _tool("tune_workload").main(["cifar10", "1200"]) == 2
    err = capsys.readouterr().err
    assert "no GPU here" in err and err.count("\n") == 1


@pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")
def test_recheck_runs_the_check_as_often_as_asked_and_fails_with_it(capsys, monkeypatch):
    tool = _tool("recheck_candidate")
    name = "09 tiles weights_in=shared tpb=128 split=2 prefetch=1"
    assert tool.main(["cifar10", "conv3", name, "--times", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 2 and "0 of 2 failed" in out
    assert tool.main(["cifar10", "conv3", "no such candidate"]) == 2
    assert "09 tiles" in capsys.readouterr().err
    real = tool.lk.check.check_group
    monkeypatch.setattr(tool.lk.check, "check_group",
                        lambda *a, **kw: type(real(*a, **kw))("conv3", False, detail="planted"))
    assert tool.main(["cifar10", "conv3", name, "--times", "1"]) == 1
