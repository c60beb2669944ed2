"""Every config file composes; the science keys resolve; mistakes fail at compose time with the valid
options."""

import subprocess

import pytest
from hydra import compose
from omegaconf import OmegaConf, open_dict, read_write

from bert_repro.model import BertConfig
from bert_repro.tables.compose import composing

from .conftest import CONF, REPO, train_py


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(overrides: list[str]):
    with composing():
        return compose("train", overrides=overrides, return_hydra_config=True)


def resolved(cfg):
    """Resolve everything except the hydra: interpolations that only exist inside a running app."""
    from hydra.core.hydra_config import HydraConfig

    with open_dict(cfg), read_write(cfg.hydra):
        cfg.hydra.runtime.output_dir = "/tmp/out"
        cfg.hydra.runtime.cwd = str(REPO)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("group", ["model", "task", "ablation", "scale", "trainer", "logger", "callbacks",
                                   "debug", "experiment"])
@pytest.mark.slow
def test_every_option_composes(group):
    for name in options(group):
        overrides = [f"{group}={name}"]
        if group == "scale" and name != "smoke":
            overrides.append("data.corpus=/some/corpus")
        if group == "experiment" and name == "pretrain_phase2":
            overrides.append("ckpt_path=/some/phase1/last.ckpt")  # mandatory (???): the run it resumes
        cfg = resolved(compose_cfg(overrides))
        assert cfg["task"]["name"] and cfg["model"]["hidden_size"] > 0, (group, name)


@pytest.mark.parametrize("name", options("model"))
@pytest.mark.slow
def test_model_configs_build_bert_config(name):
    cfg = resolved(compose_cfg([f"model={name}"]))
    config = BertConfig(**cfg["model"])
    assert config.intermediate_size == 4 * config.hidden_size
    if name.startswith("L"):  # the Table 6 grid names encode L, H, A
        layers, hidden, heads = (int(part[1:]) for part in name.split("_"))
        assert (config.num_layers, config.hidden_size, config.num_heads) == (layers, hidden, heads)


def test_every_task_of_the_paper_has_a_config():
    paper_tasks = {"pretrain", "mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "wnli",
                   "squad_v1", "squad_v2", "conll2003", "swag"}
    # make demo's offline stand-ins for GLUE (data/pydoc_tasks.py)
    demo_tasks = {"pydoc_order", "pydoc_next", "pydoc_punct"}
    assert paper_tasks | demo_tasks == set(options("task"))


@pytest.mark.slow
def test_paper_hyper_parameters_in_task_configs():
    squad2 = resolved(compose_cfg(["task=squad_v2"]))
    assert (squad2["optim"]["lr"], squad2["optim"]["epochs"], squad2["data"]["batch_size"]) == (5e-5, 2, 48)
    mrpc = resolved(compose_cfg(["task=mrpc"]))
    assert (mrpc["optim"]["epochs"], mrpc["data"]["batch_size"], mrpc["data"]["max_seq_length"]) == (3, 32,
                                                                                                     128)
    paper = resolved(compose_cfg(["scale=paper", "data.corpus=/c"]))
    assert (paper["optim"]["max_steps"], paper["optim"]["warmup_steps"], paper["optim"]["lr"]) == (1_000_000,
                                                                                                   10_000,
                                                                                                   1e-4)
    assert (paper["data"]["batch_size"], paper["data"]["max_seq_length"]) == (256, 512)


@pytest.mark.slow
def test_ablations_reach_model_and_data():
    ltr = resolved(compose_cfg(["ablation=ltr_no_nsp"]))
    assert ltr["model"]["causal"] and ltr["data"]["ltr"] and not ltr["data"]["nsp"] and ltr["module"]["ltr"]
    mask = resolved(compose_cfg(["ablation=mask_80_0_20"]))
    assert mask["data"]["mask_shares"] == [0.8, 0.0, 0.2] and mask["data"]["nsp"]
    assert resolved(compose_cfg(["ablation=no_nsp"]))["module"]["nsp"] is False


def run_train(*args: str) -> subprocess.CompletedProcess:
    return train_py(*args, timeout=120)


@pytest.mark.e2e
def test_cfg_job_prints_large_squad():
    out = run_train("--cfg", "job", "model=large", "task=squad_v1")
    assert out.returncode == 0, out.stderr
    model = OmegaConf.create(out.stdout).model
    assert (model.num_layers, model.hidden_size, model.num_heads) == (24, 1024, 16)


@pytest.mark.e2e
def test_misspelled_option_lists_choices():
    out = run_train("--cfg", "job", "model=larg")
    assert out.returncode != 0
    assert "large" in out.stderr and "base" in out.stderr


@pytest.mark.e2e
def test_misspelled_key_lists_valid_keys():
    out = run_train("--cfg", "job", "model.num_layer=24")
    assert out.returncode != 0
    assert "did you mean 'model.num_layers'" in out.stderr and "num_heads" in out.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("target",
                         ["bert_repro.tasks.ranking.RankingModule", "bert_repro_plugins.tasks.Mine"])
def test_unknown_task_module_fails_clearly(tmp_path, target, minilm_dir):
    out = run_train("task=mrpc", f"module._target_={target}", f"data.tokenizer={minilm_dir}",
                    f"hydra.run.dir={tmp_path}", "logger=none")
    assert out.returncode == 2
    message = out.stdout + out.stderr  # Hydra's console log handler writes to stdout
    assert f"Error locating target '{target}'" in message
    assert "Traceback" not in message and not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("override, key", [("optim.lr=abc", "lr"), ("optim.epochs=1.5", "epochs"),
                                           ("speed.compile=maybe", "compile"), ("optim.lrr=1", "lrr")])
@pytest.mark.slow
def test_typed_configs_refuse_a_wrong_value_when_composed(override, key):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(["task=mrpc", override])
    assert key in str(err.value) + str(err.value.__cause__)


def test_speed_and_place_keys_are_one_declaration():
    """keys.py decides, for every composed key: trainer/, speed/, paths, logger, callbacks are not science;
    the paper's axes are; a run folder's name and selection's restarts follow it."""
    from bert_repro.keys import flatten, is_science, science
    from bert_repro.lifecycle.hydra_hooks import run_name
    from bert_repro.selection import _science

    cfg = resolved(compose_cfg(["task=mrpc", "logger=csv"]))
    kept = science(cfg)
    assert {"trainer", "speed", "paths", "logger", "callbacks", "checkpoint", "ckpt_path",
            "test"}.isdisjoint(kept)
    assert {"model", "task", "module", "data", "optim", "ablation", "scale", "seed", "init"} <= kept.keys()
    # science: batch makeup
    assert "cache_dir" not in kept["data"] and kept["data"]["group_by_length"] is False
    assert all(is_science(k) for k in flatten(kept))
    # results.json before
    old_layout = {**cfg, "data": {**cfg["data"], "num_workers": 4, "padding": "max_length"}}
    assert _science(old_layout) == _science({**cfg, "seed": 7, "speed": {"unpad": True}})
    assert run_name(["task=mrpc", "trainer=gpu", "speed.unpad=true", "trainer.devices=2",
                     "+trainer.max_time=9", "optim.lr=1e-5", "seed=2"]) == "optim.lr-1e-05+seed-2+task-mrpc"
    assert run_name(["init=/a", "optim.lr=1e-5"]) != run_name(["init=/b", "optim.lr=1e-5"])



@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [(True, False, "bf16-mixed"),
                                                              (False, True, "bf16-mixed"),
                                                              (False, False, "32-true")])
def test_cpu_precision_takes_bf16_only_where_the_cpu_has_it(monkeypatch, avx512_bf16, amx, expected):
    """${cpu_precision:} (make demo's pre-training): bf16 autocast where the CPU multiplies bf16 natively,
    fp32 where bf16 would be emulated; torch's CPU feature probes mocked at their boundary."""
    import torch

    from bert_repro.lifecycle.hydra_hooks import run_name

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert OmegaConf.create({"precision": "${cpu_precision:}"}).precision == expected
    # a speed key: either precision runs in the same folder, so a finished run is reused
    assert run_name(["task=pretrain", "trainer.precision=${cpu_precision:}"]) == run_name(["task=pretrain"])


@pytest.mark.slow
def test_callbacks_group_extends_from_the_command_line():
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from bert_repro.lifecycle.trainer import build_callbacks

    early = ("+callbacks.early={_target_: lightning.pytorch.callbacks.EarlyStopping, "
             "monitor: val/f1, mode: max}")
    cfg = OmegaConf.create(resolved(compose_cfg(["task=mrpc", early])))
    callbacks = build_callbacks(cfg, {}, resume_strict=False, loggers=[])
    assert any(isinstance(c, EarlyStopping) for c in callbacks)
    best = next(c for c in callbacks if isinstance(c, ModelCheckpoint))  # the first: best on Dev
    assert best.monitor == "val/f1" and best.dirpath == "/tmp/out/checkpoints"
    cfg = OmegaConf.create(resolved(compose_cfg(["task=mrpc", "~callbacks.preemption"])))
    assert len(build_callbacks(cfg, {}, resume_strict=False, loggers=[])) == len(callbacks) - 2


@pytest.mark.slow
def test_vocabulary_is_resolved_once_from_init_or_tokenizer(minilm_dir, tmp_path):
    from bert_repro.lifecycle.spec import resolve_vocab

    base = resolved(compose_cfg(["task=mrpc"]))
    from_init, lower, source = resolve_vocab(OmegaConf.create({**base, "init": str(minilm_dir)}))
    from_file, _, _ = resolve_vocab(OmegaConf.create({**base,
                                                   "data": {**base["data"], "tokenizer": str(minilm_dir)}}))
    assert from_init == from_file and len(from_init) == 30522 and from_init[101:104] == ["[CLS]", "[SEP]",
                                                                                         "[MASK]"]
    assert lower is True and source == f"init={minilm_dir}"
    assert resolve_vocab(OmegaConf.create(base)) == (None, True, None)  # pre-training trains its own


@pytest.mark.slow
def test_glue_tasks_compose_on_one_base():
    for name in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"):
        cfg = resolved(compose_cfg([f"task={name}"]))
        assert cfg["data"]["task"] == name and cfg["task"]["hub"] == {"path": "nyu-mll/glue", "name": name}
        # §4.1
        assert (cfg["optim"]["lr"], cfg["optim"]["epochs"], cfg["data"]["batch_size"]) == (2e-5, 3, 32)
    assert (resolved(compose_cfg(["model=L24_H1024_A16"]))["model"]
            == resolved(compose_cfg(["model=large"]))["model"])


@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_slurm"])
def test_launchers_compose(launcher):
    cfg = compose_cfg([f"hydra/launcher={launcher}"])
    assert launcher.split("_")[0] in cfg.hydra.launcher._target_.lower()

