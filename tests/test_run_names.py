"""Run folders the platform's own commands accept: every folder name (hydra_hooks.run_name) is a value Hydra's
override parser takes unquoted, so ``init=<run>/checkpoints/best.ckpt`` and ``ckpt_path=...`` work as typed; a
path value never nests folders or leaves the task's; a table finds its jobs where Hydra put them."""

import re

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from bert_repro.keys import is_path
from bert_repro.lifecycle.hydra_hooks import MAX_NAME, run_name
from bert_repro.tables import TABLES, runner
from bert_repro.tables.spec import CONF_DIR, Sweep, TableError, build

ITEM = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.-]+")  # key-value: the key holds no "-", the value no "+"


def hydra_config(overrides: list[str], config_name: str = "train"):
    """The run's config with its hydra node, as src/train.py (or src/evaluate.py: "evaluate") would see it."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name, overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def passes_back(folder: str) -> bool:
    """The folder's checkpoints, given back to the platform as init= and ckpt_path=, read as the same path.
    One parse stands for all four: Hydra's grammar reads a value alike after either key, and best.ckpt and
    last.ckpt are the same kind of characters (a table's folders are thousands, a parse milliseconds)."""
    path = f"{folder}/checkpoints/best.ckpt"
    return OverridesParser.create().parse_override(f"init={path}").value() == path


@pytest.mark.parametrize("overrides", [
    ["task=mrpc", "optim.lr=5e-5", "optim.epochs=3", "trainer=gpu"],
    ["task=rte", "ablation=no_nsp", "model=large", "seed=2", "optim.lr=1e30"],
    ["task=mrpc", "init=bert-base-uncased", "optim.warmup_ratio=0.1"],
    ["task=mrpc", "init=outputs/mrpc/optim.lr-2e-05/checkpoints/best.ckpt", "data.group_by_length=true"],
    ["task=sst2", "data.max_train_examples=1000", "data.max_seq_length=64", "optim.weight_decay=0.0",
     "optim.warmup_ratio=0.06", "optim.max_steps=-1", "optim.gradient_clip_val=1.0", "optim.epochs=2",
     "optim.lr=2e-5", "seed=12345", "ablation=no_nsp", "model=L6_H768_A3", "scale=budget"],
])
def test_a_run_folder_is_a_valid_unquoted_init_and_ckpt_path(overrides):
    cfg = hydra_config(overrides)
    folder = cfg.hydra.run.dir
    name = folder.rsplit("/", 1)[1]
    assert folder == f"outputs/{cfg.task.name}/{run_name(overrides)}" and passes_back(folder)
    assert len(name) <= MAX_NAME and all(ITEM.fullmatch(item) for item in name.split("+")), name


def test_names_read_as_sorted_key_value_items():
    lr_epochs = run_name(["optim.lr=5e-5", "optim.epochs=3", "trainer.devices=2"])
    assert lr_epochs == "optim.epochs-3+optim.lr-5e-05"
    assert run_name(["ablation=no_nsp", "model=large"]) == "ablation-no_nsp+model-large"
    assert run_name(["trainer=gpu", "logger=csv"]) == "default"  # speed and places only


def test_a_path_value_is_hashed_never_a_folder():
    """data.files.train=../x/y.tsv once nested two folders and, by "..", left the task's."""
    assert is_path("data.files.train") and is_path("data.files") and not is_path("data.filesystem")
    names = [run_name(["task=mrpc", f"data.files.train=../x/{f}.tsv", "optim.lr=1e-5"]) for f in ("y", "z")]
    assert names[0] != names[1]  # other data, another folder
    for name in names + [run_name(["data.note=a/b"]), run_name(["data.note=a..b"])]:
        assert "/" not in name and ".." not in name and re.fullmatch(r"([\w.-]+\+)*hash-[0-9a-f]{8}", name)
    assert names[0].startswith("optim.lr-1e-05+task-mrpc+hash-")


def test_a_long_name_keeps_whole_items_and_hashes_the_rest():
    many = [f"data.key_{i:02d}=value_{i:02d}" for i in range(20)]
    name = run_name(many)
    assert len(name) <= MAX_NAME and all(ITEM.fullmatch(item) for item in name.split("+"))
    assert name != run_name(many[:-1])  # the items past the cap still tell runs apart


@pytest.mark.slow
def test_a_table_job_is_where_hydra_puts_it_and_passes_back(tmp_path):
    """The table runner's command, as Hydra composes it, names each job's folder as Sweep.jobs expects it
    (one definition: run_name), the table's fixed keys left out."""
    table = build("table5", "smoke", tmp_path / "runs", sets=["grid.optim.lr=2e-4,1e-3", "grid.seed=1,2"])
    sweep = table.sweeps["finetune/bert_base/mrpc"]
    jobs = sweep.jobs()
    assert sorted(folder.name for _, folder in jobs) == [
        "optim.lr-0.0002+seed-1", "optim.lr-0.0002+seed-2", "optim.lr-0.001+seed-1", "optim.lr-0.001+seed-2"]
    for swept, folder in jobs:
        command = runner.command(sweep, swept, {})
        cfg = hydra_config(command[command.index("--multirun") + 1:])
        assert f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}" == str(folder) and passes_back(str(folder))


@pytest.mark.slow
def test_every_tables_run_folders_pass_back(tmp_path):
    """Fine-tuning starts from the table's own pre-training checkpoint by init=, phase 2 from phase 1's by
    ckpt_path=: every folder a table writes is such a value (budget: the widest grids, both phases)."""
    for name in TABLES:
        for sweep in build(name, "budget", tmp_path, inits={"*": "/ckpt/given"}).sweeps.values():
            assert all(passes_back(str(folder)) for _, folder in sweep.jobs()), sweep.name


def test_a_grid_over_a_speed_key_is_refused(tmp_path):
    """run_name leaves speed keys out of the folder: such a grid's jobs would overwrite one another."""
    sweep = Sweep("finetune", "finetune/a/mrpc", tmp_path, {"task": "mrpc"}, {"trainer.devices": "1,2"})
    with pytest.raises(TableError, match="trainer.devices"):
        sweep.jobs()
