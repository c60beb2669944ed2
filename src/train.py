"""Train or fine-tune one configuration: `python src/train.py model=base task=mrpc init=/ckpt/bert-base`.

Sweeps: `python src/train.py -m task=mrpc optim.lr=5e-5,3e-5,2e-5 optim.epochs=3,4`.
The work lives in `bert_repro.lifecycle.run`; this file only hands Hydra's composed config over.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from bert_repro.lifecycle import hydra_hooks

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from bert_repro.lifecycle.run import main as run_main  # torch loads only once a run starts training

    return run_main(cfg)  # the value a Hydra sweeper optimises: the task's monitored metric


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exit_:
        # Hydra printed its compose error: add the keys that do exist (not after a run started)
        if exit_.code not in (0, None) and not hydra_hooks.composed:
            for hint in hydra_hooks.unknown_key_hints(sys.argv[1:], CONFIG_DIR):
                print(hint, file=sys.stderr)
        raise
