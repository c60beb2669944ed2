"""``make curves RUN=...``: a run's loss, learning rate and Dev metrics drawn from its CSV history, beside it;
a folder that is not a run, or a run without history, named with exit 2."""

import csv

import pytest

from bert_repro.curves import HISTORY, main, panel, read_history


@pytest.mark.slow
def test_the_good_runs_curves_are_drawn_beside_it(good, tmp_path, capsys):
    import shutil

    from matplotlib.image import imread

    _, out, _, _ = good
    run = tmp_path / "good"
    # a copy: the good run stays as it was for the other tests
    shutil.copytree(out, run, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    series = read_history(run / HISTORY)
    drawn = {panel(k) for k in series} - {None}
    assert drawn == {"loss", "learning rate", "Dev"}, sorted(series)  # each panel has a real column
    with open(run / HISTORY) as f:
        steps = {int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")}
    assert [s for s, _ in series["train/loss"]] == sorted(steps) and max(steps) <= 4  # max_steps=4
    assert main([str(run)]) == 0
    png = run / "curves.png"
    assert capsys.readouterr().out.strip() == str(png)
    height, width, _ = imread(png).shape
    assert height == 900 and width == 800  # three panels of 3 x 8 inches at 100 dpi


@pytest.mark.parametrize("what", ["missing", "no_history", "empty_history"])
@pytest.mark.slow
def test_bad_runs_are_named_with_exit_2(good, tmp_path, what, capsys):
    _, out, _, _ = good
    run = tmp_path / "run"
    if what != "missing":
        run.mkdir()
        (run / "results.json").write_text((out / "results.json").read_text())
    if what == "empty_history":
        (run / HISTORY).parent.mkdir()
        (run / HISTORY).write_text("epoch,step,train/tokens_per_s\n0,1,5.0\n")
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    expected = {"missing": "no such run folder", "no_history": "no CSV history",
                "empty_history": "no loss, learning-rate"}[what]
    assert err.startswith(f"error: {run}") and expected in err and "Traceback" not in err
    assert not (run / "curves.png").exists()

