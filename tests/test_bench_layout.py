"""The benchmark runner: suite registry dispatch and the layout suite's JSON record."""
from __future__ import annotations

import json

from tegula.bench import SUITES, format_table
from tegula.bench.__main__ import main as bench_main


def test_registry_names_the_layout_suite_and_rejects_unknown_ones(capsys):
    assert SUITES["layout"] == "tegula.bench.layout"
    assert bench_main(["no-such-suite"]) == 2
    assert "unknown benchmark suite" in capsys.readouterr().err
    assert bench_main(["--help"]) == 0


def test_layout_suite_writes_a_json_record(tmp_path, capsys):
    assert bench_main(["layout", "--min-time", "0.001", "--repeat", "1",
                       "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "ops/s" in printed and "composition" in printed
    (path,) = tmp_path.glob("layout-*.json")
    record = json.loads(path.read_text())
    assert record["suite"] == "layout"
    assert {"platform", "python", "cpu"} <= set(record["machine"])
    names = [r["name"] for r in record["results"]]
    assert "right_inverse C-TV" in names and "symbolic composition" in names
    assert all(r["ops_per_sec"] > 0 for r in record["results"])


def test_format_table_aligns_numbers_right():
    text = format_table(("op", "n"), [("a", 1.5), ("bb", 1234.0)])
    lines = text.splitlines()
    assert lines[0].startswith("op") and lines[2].endswith("1.5") and lines[3].endswith("1,234.0")
