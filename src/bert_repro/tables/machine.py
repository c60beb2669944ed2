"""What a table's runs need of the machine they launch on, checked before the first job: a CUDA device
where their trainer trains on GPUs, and the Hugging Face Hub (or the data set already in the run's cache)
where their data come from it. A table launched through SLURM, or onto a Ray cluster by its address, runs on
the cluster's nodes: nothing is asked of this one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bert_repro.tables import ray_jobs
from bert_repro.tables.compose import compose_run, composing_jobs
from bert_repro.tables.spec import Table, flatten

PROBE_S = 10.0  # a Hub that has not answered one request in this long is not one a table can rely on
WAYS_OUT = ("ACTION=rehearse (the same plan shrunk to minutes on this CPU), a cached data set (the same "
            "command run once where the Hub answers, with the same cache: BERT_REPRO_CACHE=<folder>), or "
            "LAUNCHER=slurm (python -m bert_repro.tables run ... --launcher slurm: the runs go to a "
            "cluster's GPU nodes)")


def hub_datasets(data: dict[str, Any]) -> list[tuple[str, Path]]:
    """The Hub data sets a run's resolved data node reads, each with the datasets cache its DataModule keeps
    it in: pre-training's corpora with data.source=hub (data/hub.py), a task's data.hub where no local copy is
    given (every ``*_dir`` null, no files: data/base.hub_split)."""
    from bert_repro.data.base import HUB_CACHE
    from bert_repro.data.hub import HF_CACHE

    cache = Path(str(data.get("cache_dir")))
    if data.get("source") == "hub":
        return [(e["path"], cache / HF_CACHE) for e in data.get("hub") or [] if not Path(e["path"]).exists()]
    local = [v for k, v in data.items() if k.endswith("_dir") and k != "cache_dir"]
    if "source" in data or not isinstance(data.get("hub"), dict) or not local or any(local) \
            or any(flatten(data.get("files") or {}).values()):
        return []
    return [(data["hub"]["path"], cache / HUB_CACHE)]


def _cached(path: str, cache: Path) -> bool:
    from datasets.load import CachedDatasetModuleFactory  # what load_dataset reads when the Hub is away

    try:
        CachedDatasetModuleFactory(path, cache_dir=str(cache)).get_module()
    except (FileNotFoundError, AssertionError):  # AssertionError: a name it cannot hold (a/b/c)
        return False
    return True


def _hub_unreachable(path: str) -> str | None:
    """Why the Hub cannot give ``path`` now, or None when it answers."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import httpx

    from bert_repro.network import network_fault

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    try:
        HfApi().dataset_info(path, timeout=PROBE_S)
    except Exception as err:  # a gated or missing data set still answers: the run names that itself
        if isinstance(fault := network_fault(err), httpx.TimeoutException):
            return f"{constants.ENDPOINT} did not answer within {PROBE_S:g} s"
        if fault is not None:
            return f"{constants.ENDPOINT} cannot be reached ({type(fault).__name__}: {fault})"
    return None


def refusal(table: Table, todo: dict[str, list], launcher: dict | None) -> str | None:
    """Why this machine cannot run ``todo`` (each sweep's jobs left to run), naming what is missing, which
    sweeps need it and the ways out; None when it can, or when the launcher sends the runs elsewhere."""
    launcher = launcher or {}
    if any("submitit_slurm" in str(v) for v in flatten(launcher).values()) \
            or (launcher.get(ray_jobs.KEY) or {}).get("address"):  # a Ray cluster's nodes, not this one
        return None
    gpu: list[str] = []
    hub: dict[tuple[str, Path], list[str]] = {}
    with composing_jobs():
        for name, jobs in todo.items():
            if not jobs:
                continue
            cfg = compose_run([*table.sweeps[name].compose_args(), *jobs[0][0]])
            if cfg.trainer.accelerator in ("gpu", "cuda"):
                gpu.append(name)
            for wanted in hub_datasets(OmegaConf.to_container(cfg.data, resolve=True)):
                hub.setdefault(wanted, []).append(name)
    missing = []
    if gpu:
        import torch

        if not torch.cuda.is_available():
            missing.append(f"a CUDA GPU: {_sweeps(gpu)} train with trainer.accelerator=gpu, and torch "
                           "sees no CUDA device here")
    absent = {key: names for key, names in hub.items() if not _cached(*key)}
    if absent and (why := _hub_unreachable(next(iter(absent))[0])):
        sets, caches = sorted({path for path, _ in absent}), sorted({str(cache) for _, cache in absent})
        readers = _sweeps([name for names in absent.values() for name in names])
        missing.append(f"the Hugging Face Hub ({why}): {readers} read {', '.join(sets)}, not in their cache "
                       f"({', '.join(caches)})")
    if not missing:
        return None
    return (f"{table.name} at scale={table.scale} cannot run on this machine: it lacks "
            f"{'; and '.join(missing)}. Nothing was launched or moved, and the collected tables are as they "
            f"were. Ways out: {WAYS_OUT}")


def _sweeps(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    return f"{len(unique)} sweeps ({', '.join(unique[:3])}{', ...' if len(unique) > 3 else ''})"
