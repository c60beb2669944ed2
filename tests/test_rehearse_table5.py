"""Table 5's paper-scale plan rehearsed end to end on this CPU (ACTION=rehearse; a file of its own so that
the suite's two rehearsals run on two pytest-xdist workers at once)."""

import pytest

from .helpers import assert_plan_holds, rehearse


@pytest.mark.slow
def test_table5_rehearses_at_paper_scale(tmp_path, monkeypatch, shared_data):
    """Each grid's first point (GRID=first): the full plan's 202 runs would take the suite some 10 minutes."""
    folder, cells, record = rehearse("table5", "paper", tmp_path, monkeypatch, "--rehearse-grid", "first")
    assert record["runs"] == 6 + 4 * (4 * 18 + 1) and record["rehearsed_jobs"] == 6 + 4 * 5
    ours = [c for c in cells if c["status"] != "paper"]
    assert ours and all(c["status"] == "ok" for c in ours), [c for c in ours if c["status"] != "ok"]
    assert_plan_holds(record, folder)
