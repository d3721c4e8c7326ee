"""`tegula agent ...` on the command line: evaluate's exit status (0 only when correct),
tasks listing and writing, the loop on a replay, usage errors as one line."""
from __future__ import annotations

import os

from tegula.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))


def test_evaluate_exit_status(capsys, tmp_path):
    good = os.path.join(HERE, "candidates", "relu_ok.py")
    assert main(["agent", "evaluate", "relu", good, "--cpu", "--trials", "2"]) == 0
    assert capsys.readouterr().out.startswith("PASS")
    bad = tmp_path / "zeros.py"
    bad.write_text(open(good).read().replace("tg.maximum(tile, 0.0)", "tile * 0.0"))
    assert main(["agent", "evaluate", "relu", str(bad), "--cpu", "--json"]) == 1
    out = capsys.readouterr().out
    assert '"ok": false' in out and '"stage": "check"' in out


def test_evaluate_accepts_task_files(tmp_path, capsys):
    assert main(["agent", "tasks", "--write", str(tmp_path)]) == 0
    assert "wrote 38 task files" in capsys.readouterr().out
    good = os.path.join(HERE, "candidates", "softmax_ok.py")
    assert main(["agent", "evaluate", str(tmp_path / "softmax.py"), good, "--cpu",
                 "--trials", "1"]) == 0


def test_usage_errors(capsys):
    assert main(["agent", "evaluate", "relu", "missing.py"]) == 2
    assert "no candidate file 'missing.py'" in capsys.readouterr().err
    assert main(["agent", "relu", "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "--endpoint needs --model" in capsys.readouterr().err


def test_loop_on_a_replay(tmp_path, capsys):
    replay = os.path.join(HERE, "replays", "relu_first_try.txt")
    assert main(["agent", "relu", "--replay", replay, "--run-dir", str(tmp_path / "run"),
                 "--optimize-steps", "0", "--cpu"]) == 0
    captured = capsys.readouterr()
    assert "best kernel:" in captured.out and "generate: PASS" in captured.err
    assert (tmp_path / "run" / "best.py").exists()
