"""Train or fine-tune one configuration: `python src/train.py model=base task=mrpc init=/ckpt/bert-base`.

Sweeps: `python src/train.py -m task=mrpc optim.lr=5e-5,3e-5,2e-5 optim.epochs=3,4`.
The work lives in `bert_repro.lifecycle.run`; this file only hands Hydra's composed config over.
"""

from pathlib import Path

from bert_repro.signals import stop_at_start

stop_at_start()  # before the imports below load Hydra (hence their noqa: E402)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from bert_repro.lifecycle import hydra_hooks  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from bert_repro.lifecycle.run import main as run_main  # torch loads only once a run starts training

    return run_main(cfg)  # the value a Hydra sweeper optimises: the task's monitored metric


if __name__ == "__main__":
    hydra_hooks.entry(main, CONFIG_DIR, "train")  # Hydra's compose errors with the hints it leaves out
