"""A science key added with a declared value (keys.ADDED: what every run computed before it existed)
keeps what was finished: the same run folder, the same store name, nothing rerun. Another default is another
science. The key is added to the typed model node here, as docs/extending.md's step 1 adds it."""

from dataclasses import field, make_dataclass

import pytest
from hydra.core.config_store import ConfigStore

from bert_repro import keys
from bert_repro.config import ModelConfig
from bert_repro.lifecycle.finished import FolderHoldsOtherResult, finished_results
from bert_repro.tables import compose, runner

from .test_table_rerun import stand_in, tiny


@pytest.fixture
def schema():
    """``schema(default)``: from then on the typed model node has a ``pre_ln`` field of that default."""
    def extend(default: bool) -> None:
        node = make_dataclass("PreLN", [("pre_ln", bool, field(default=default))], bases=(ModelConfig,))
        ConfigStore.instance().store(group="schema", name="model", node=node)
        compose._COMPOSED.clear()  # in-process only: the cache on disk is keyed by the schema itself
        compose._tree.cache_clear()

    yield extend
    ConfigStore.instance().store(group="schema", name="model", node=ModelConfig)
    compose._COMPOSED.clear()
    compose._tree.cache_clear()


def first_job(sweep):
    """The sweep's first job as src/train.py composes it in its folder: (its model node, finished_results)."""
    swept, folder = sweep.jobs()[0]
    with compose.composing_jobs():
        cfg = compose.compose_run([*sweep.compose_args(), *swept, f"paths.output_dir={folder}"])
        return dict(cfg.model), finished_results(cfg)


@pytest.mark.slow  # composes and runs (stand-in launches) a small table three times
def test_a_new_key_at_its_declared_value_keeps_every_finished_result_and_another_default_does_not(
        tmp_path, monkeypatch, schema):
    launched = []
    before = tiny(tmp_path)
    stand_in(before, monkeypatch, launched)
    runner.run_table(before)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"]
    store = before.sweeps["pretrain/none"].folder

    monkeypatch.setattr(keys, "ADDED", {"model.pre_ln": False})
    schema(False)
    added = tiny(tmp_path)
    model, done = first_job(added.sweeps["pretrain/none"])
    assert model["pre_ln"] is False and done is not None  # the key is there, the finished run found again
    assert added.sweeps["pretrain/none"].folder == store  # the stored pre-training keeps its name
    launched.clear()
    stand_in(added, monkeypatch, launched)
    runner.run_table(added)
    assert launched == []  # the finished table: nothing reruns

    schema(True)
    other = tiny(tmp_path)
    assert other.sweeps["pretrain/none"].folder != store
    with pytest.raises(FolderHoldsOtherResult, match=r"model.pre_ln: absent \(so False\), now True"):
        first_job(before.sweeps["pretrain/none"])  # the old store folder, composed with the new default
    stand_in(other, monkeypatch, launched)
    runner.run_table(other)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"]


def test_checkpoints_and_restarts_recorded_before_the_key_are_its_earlier_value(monkeypatch):
    """Where else a result is compared: a checkpoint given as init= or resumed, and the restarts a table
    groups, each written before ``model.pre_ln`` existed."""
    from bert_repro.identity import architecture_differences, science_differences
    from bert_repro.lifecycle.reliability import ResumeMismatch, SameRun
    from bert_repro.selection import _science

    old = {"hidden_size": 128}
    forgotten = science_differences({"model": old}, {"model": {**old, "pre_ln": False}})
    assert forgotten == ["model.pre_ln: absent, now False (a key added since? bert_repro/keys.py ADDED "
                         "declares the value runs had before it)"]  # the refusal says what undoes it
    monkeypatch.setattr(keys, "ADDED", {"model.pre_ln": False})
    now, other = {**old, "pre_ln": False}, {**old, "pre_ln": True}
    assert architecture_differences(old, now) == []
    assert architecture_differences(old, other) == ["model.pre_ln: checkpoint has no such key, this run True"]
    assert science_differences({"model": old}, {"model": now}) == []
    differ = ["model.pre_ln: absent (so False), now True"]
    assert science_differences({"model": old}, {"model": other}) == differ
    assert _science({"model": old, "seed": 1}) == _science({"model": now, "seed": 2})
    assert _science({"model": old}) != _science({"model": other})
    SameRun({"model": now}, strict=True).load_state_dict({"settings": {"model": old}})  # resumes
    with pytest.raises(ResumeMismatch, match=r"model.pre_ln: absent \(so False\), now True"):
        SameRun({"model": other}, strict=True).load_state_dict({"settings": {"model": old}})
