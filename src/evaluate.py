"""Evaluate a checkpoint on a task, and predict a file, without training:
`python src/evaluate.py task=mrpc init=<our .ckpt | Hub id | HF dir> [predict=<file>]`.

The work lives in `bert_repro.lifecycle.evaluation`; this file only hands Hydra's composed config
(conf/evaluate.yaml) over.
"""

from pathlib import Path

from bert_repro.signals import stop_at_start

stop_at_start()  # before the imports below load Hydra (hence their noqa: E402)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from bert_repro.lifecycle import hydra_hooks  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    from bert_repro.lifecycle.evaluation import main as evaluate_main  # torch loads only when a run starts

    return evaluate_main(cfg)


if __name__ == "__main__":
    hydra_hooks.entry(main, CONFIG_DIR, "evaluate")  # Hydra's compose errors with the hints it leaves out
