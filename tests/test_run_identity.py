"""One run, one owner: ``train(cfg)`` in-process on a config that nothing may rewrite, and a
result known by its science, not its folder: an edited config file never writes over a finished result, and a
forced rerun killed half-way leaves a folder that says it is unfinished, with the earlier result kept."""

import hashlib
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from bert_repro.lifecycle.folder import RunFolder, find_runs
from bert_repro.lifecycle.run import main

from .conftest import CONF, FAST

pytestmark = pytest.mark.e2e


def composed(overrides: list[str], conf: Path = CONF):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("train", overrides=overrides)


def fingerprint(folder: Path) -> dict[str, str]:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and ".hydra" not in p.parts]
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny pre-training run by ``main`` in this process, on a config frozen before it starts."""
    tmp = tmp_path_factory.mktemp("identity")
    places = [f"paths.output_dir={tmp / 'pretrain'}", f"paths.cache_dir={tmp / 'cache'}",
              f"paths.shared_data={tmp / 'no_data'}"]  # without Hydra's run: no ${hydra:runtime.cwd}
    cfg = composed([*FAST, *places])
    OmegaConf.set_readonly(cfg, True)  # written after this, it raises: nothing downstream may rewrite it
    main(cfg)
    return tmp, places


def test_a_frozen_config_runs_a_pretraining_and_a_fine_tuning(pretrained):
    tmp, _ = pretrained
    done = RunFolder(tmp / "pretrain").complete()
    assert done is not None and done["global_step"] == 4
    # the pre-training's checkpoint as init= of a fine-tuning (no Hydra run here: model= counts as given)
    cfg = composed(["task=pydoc_next", "model=tiny", "logger=none", "trainer.enable_progress_bar=false",
                    "optim.epochs=1", "data.train_examples=32", "data.dev_examples=16", "data.batch_size=16",
                    f"init={RunFolder(tmp / 'pretrain').last}", f"paths.output_dir={tmp / 'finetune'}",
                    f"paths.cache_dir={tmp / 'cache'}", f"paths.shared_data={tmp / 'no_data'}"])
    OmegaConf.set_readonly(cfg, True)
    assert main(cfg) is not None
    result = RunFolder(tmp / "finetune").complete()
    assert result["task"] == "pydoc_next" and result["global_step"] == 2
    assert result["config"]["model"]["num_layers"] == done["config"]["model"]["num_layers"]
    assert result["init"] == str(RunFolder(tmp / "pretrain").last)


def test_an_edited_config_file_never_writes_over_a_finished_result(pretrained, tmp_path, caplog):
    tmp, places = pretrained
    folder = tmp / "pretrain"
    before = fingerprint(folder)
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    task = conf / "task" / "pretrain.yaml"  # the same command; a value edited in a file, not an override
    text = task.read_text()
    task.write_text(text.replace("masked_lm_prob: 0.15 ", "masked_lm_prob: 0.2 "))
    assert task.read_text() != text, "the test's edit did not apply"
    with pytest.raises(SystemExit) as exit_:
        main(composed([*FAST, *places], conf))
    assert exit_.value.code == 2
    assert f"{folder} holds the finished result of other settings" in caplog.text
    assert "data.masked_lm_prob: was 0.15, now 0.2" in caplog.text
    assert fingerprint(folder) == before  # its result and checkpoints, byte for byte


def test_a_forced_rerun_killed_half_way_leaves_a_folder_that_says_so(pretrained, tmp_path, monkeypatch):
    import lightning as L

    tmp, _ = pretrained
    folder = RunFolder(tmp_path / "run")
    shutil.copytree(tmp / "pretrain", folder.path)  # a finished run of the same settings
    places = [f"paths.output_dir={folder.path}", f"paths.cache_dir={tmp / 'cache'}",
              f"paths.shared_data={tmp / 'no_data'}"]
    earlier = folder.results.read_bytes()

    def killed(*args, **kwargs):  # the process dies inside the fit: no record of its own is written
        raise KeyboardInterrupt

    monkeypatch.setattr(L.Trainer, "fit", killed)
    with pytest.raises(KeyboardInterrupt):
        main(composed([*FAST, *places, "+force=true"]))
    assert folder.complete() is None and not folder.results.exists()  # unfinished, and says so
    assert find_runs([tmp_path]) == []  # selection and the collector see no result here
    kept = list((folder.path / ".previous").glob("*/results.json"))
    assert [p.read_bytes() for p in kept] == [earlier]  # the earlier result is set aside, not lost
    monkeypatch.undo()
    main(composed([*FAST, *places]))  # the plain command runs it again, to the end
    assert folder.complete()["global_step"] == 4


def test_a_finished_run_from_a_moved_checkpoint_is_found_again_and_one_replaced_in_place_is_not(tmp_path):
    """A single run (src/train.py init=...) knows its start by the checkpoint's identity and step, as a
    table's jobs do: the same file moved elsewhere is the same run; another checkpoint at that path is not."""
    import json

    import torch
    from omegaconf import OmegaConf

    from bert_repro.identity import init_identity
    from bert_repro.lifecycle.finished import FolderHoldsOtherResult, finished_results

    def checkpoint(path, step):
        path.parent.mkdir(parents=True, exist_ok=True)
        identity = {"task": "pretrain", "head": None, "labels": None, "max_seq_length": 32,
                    "science": {"task": {"name": "pretrain"}, "model": {"num_layers": 2}}}
        torch.save({"identity": identity, "global_step": step}, path)
        return init_identity(torch.load(path))

    old, new, out = tmp_path / "old" / "last.ckpt", tmp_path / "moved" / "last.ckpt", tmp_path / "run"
    science = {"task": {"name": "mrpc"}, "model": {"num_layers": 2}, "seed": 1}
    out.mkdir()
    (out / "results.json").write_text(json.dumps({
        "status": "complete", "task": "mrpc", "seed": 1, "monitor": "val/acc",
        "metrics": {"final": {"val/acc": 0.7}},
        "config": {**science, "init": str(old)}, "init_identity": checkpoint(old, 2)}))
    old.rename(new.parent.mkdir() or new)
    cfg = OmegaConf.create({**science, "init": str(new), "paths": {"output_dir": str(out)}, "test": False})
    assert finished_results(cfg)["metrics"]["final"] == {"val/acc": 0.7}
    checkpoint(new, 3)  # written over in place: another checkpoint at the path the run now names
    with pytest.raises(FolderHoldsOtherResult, match=r"init.step: was 2, now 3"):
        finished_results(cfg)
