"""The GLUE head and LightningModule: metrics against scipy/sklearn, the paper's GLUE average, pooling
for bidirectional and left-to-right encoders, the BiLSTM ablation, pre-trained init and the majority class."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from bert_repro.convert import LoadedCheckpoint, load_checkpoint
from bert_repro.data.glue import GLUE_TASKS
from bert_repro.heads import SequenceClassifier
from bert_repro.metrics.glue import glue_metrics
from bert_repro.model import BertConfig, BertForPreTraining
from bert_repro.scores import degenerate_reason, glue_score
from bert_repro.tasks.classification import SequenceClassificationModule

from .helpers import ScalarReads
from .test_config import compose_cfg, resolved

TINY = dict(vocab_size=120, hidden_size=32, num_layers=2, num_heads=2)
OPTIM = dict(lr=1e-3, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, warmup_steps=0, warmup_ratio=None)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is faster, and immune to a busy machine's thread oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(lengths, seed=0, vocab=120):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def test_metrics_match_scipy_and_sklearn():
    rng = np.random.default_rng(0)
    labels, preds = rng.integers(0, 2, 500), rng.integers(0, 2, 500)
    preds[:300] = labels[:300]
    got = glue_metrics(("acc", "f1", "mcc"), 2, "val/")(torch.tensor(preds), torch.tensor(labels))
    assert got["val/acc"].item() == pytest.approx(accuracy_score(labels, preds), abs=1e-6)
    assert got["val/f1"].item() == pytest.approx(f1_score(labels, preds), abs=1e-6)
    assert got["val/mcc"].item() == pytest.approx(matthews_corrcoef(labels, preds), abs=1e-5)
    scores = rng.uniform(0, 5, 300)
    noisy = scores + rng.normal(0, 1, 300)
    got = glue_metrics(("pearson", "spearman"), 1, "val/")(torch.tensor(noisy, dtype=torch.float32),
                                                          torch.tensor(scores, dtype=torch.float32))
    assert got["val/pearson"].item() == pytest.approx(pearsonr(noisy, scores)[0], abs=1e-4)
    assert got["val/spearman"].item() == pytest.approx(spearmanr(noisy, scores)[0], abs=1e-4)


def test_glue_average_as_table1():
    """BERT-base and BERT-large rows of Table 1 (QNLI as re-built in v2): averages 79.6 and 82.1."""
    columns = ("mnli_m", "mnli_mm", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")
    base = dict(zip(columns, (84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4)))
    large = dict(zip(columns, (86.7, 85.9, 72.1, 92.7, 94.9, 60.5, 86.5, 89.3, 70.1)))
    assert round(glue_score(base), 1) == 79.6 and round(glue_score(large), 1) == 82.1
    assert (glue_score({**base, "rte": None}) is None
            and glue_score({k: base[k] for k in columns[:-1]}) is None)


def test_degenerate_runs_are_flagged():
    assert "one class" in degenerate_reason({"val/acc": 0.53, "val/top_class_share": 1.0})
    assert degenerate_reason({"val/acc": 0.83, "val/top_class_share": 0.62}) is None
    assert "constant" in degenerate_reason({"val/pearson": None, "val/spearman": None})
    assert degenerate_reason({"val/mlm_loss": 3.0}) is None


@pytest.mark.parametrize("task", sorted(GLUE_TASKS))
@pytest.mark.slow
def test_task_config_monitors_a_logged_metric(task):
    cfg = resolved(compose_cfg([f"task={task}"]))
    spec = GLUE_TASKS[task]
    logged = {f"val/{prefix}{metric}" for prefix in spec.dev.values() for metric in spec.metrics}
    assert cfg["task"]["monitor"] in logged and cfg["module"]["num_labels"] == spec.num_labels
    assert cfg["module"]["task"] == cfg["data"]["task"] == task and cfg["data"]["tokenizer"] is None
    assert (cfg["data"]["batch_size"], cfg["optim"]["epochs"], cfg["optim"]["lr"]) == (32, 3, 2e-5)  # §4.1


@pytest.mark.parametrize("causal", [False, True])
def test_pooling_reads_cls_or_the_last_real_token_and_ignores_padding(causal):
    torch.manual_seed(0)
    model = SequenceClassifier(BertConfig(**TINY, causal=causal), num_labels=3).eval()
    short, padded = batch([5, 9]), batch([5, 9])
    padded = {k: torch.cat([v, torch.zeros(2, 4, dtype=v.dtype)], dim=1) for k, v in short.items()}
    logits = model(**short)
    assert logits.shape == (2, 3)
    torch.testing.assert_close(model(**padded), logits)
    sequence = model.bert(**short).last_hidden_state
    token = sequence[torch.arange(2), torch.tensor([4, 8])] if causal else sequence[:, 0]
    torch.testing.assert_close(model.classifier(model.bert.pooler(token[:, None])), logits)
    if causal:  # the last token sees the whole input; [CLS] of a causal encoder would see only itself
        changed = {**short, "input_ids": short["input_ids"].clone()}
        changed["input_ids"][:, 2] = 7
        assert not torch.allclose(model(**changed), logits)


def test_bilstm_head_for_the_table5_ablation():
    cfg = resolved(compose_cfg(["task=mrpc", "ablation=ltr_no_nsp_bilstm", "model=tiny"]))
    assert cfg["module"]["bilstm"] is True and cfg["model"]["causal"] is True
    module = SequenceClassificationModule({**cfg["model"], "vocab_size": 120}, OPTIM, "mrpc", 2,
                                          bilstm=True).eval()
    assert (module.model.lstm is not None
            and module.model.classifier.in_features == 2 * cfg["model"]["hidden_size"])
    short = {**batch([5, 9]), "labels": torch.tensor([0, 1])}
    padded = {k: torch.cat([v, torch.zeros(2, 3, dtype=v.dtype)], dim=1) if v.dim() == 2 else v
              for k, v in short.items()}
    torch.testing.assert_close(module(padded), module(short))
    # every trained parameter gets a gradient (DDP refuses unused ones): the pooler is out of training
    module.train()
    module._loss(module(short), short["labels"]).backward()
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    assert not [n for n in trained if module.get_parameter(n).grad is None]
    assert not any("pooler" in n for n in trained)


@pytest.mark.slow
def test_init_from_a_pretrained_checkpoint_keeps_it_causal(minilm_dir):
    module = SequenceClassificationModule(dict(hidden_size=384, num_layers=6, num_heads=12), OPTIM, "stsb", 1)
    loaded = load_checkpoint(minilm_dir)
    assert module.load_pretrained(loaded) == ["classifier"]
    torch.testing.assert_close(module.model.bert.state_dict()["encoder.layer.5.output.weight"],
                               loaded.state_dict["bert.encoder.layer.5.output.weight"])
    # a left-to-right (causal) pre-trained encoder refuses a bidirectional fine-tuning model, and fits a
    # causal one
    ltr_config = BertConfig(**TINY, causal=True)
    ltr = LoadedCheckpoint(ltr_config, BertForPreTraining(ltr_config, nsp=False).state_dict(), ["nsp"], None,
                           None, "ltr.ckpt")
    with pytest.raises(ValueError, match="causal"):
        SequenceClassificationModule(TINY, OPTIM, "rte", 2).load_pretrained(ltr)
    causal = SequenceClassificationModule({**TINY, "causal": True}, OPTIM, "rte", 2, bilstm=True)
    assert causal.load_pretrained(ltr) == ["classifier", "lstm"] and causal.model.bert.config.causal


@pytest.mark.slow
def test_fine_tuning_loss_falls_on_a_batch():
    torch.manual_seed(0)
    module = SequenceClassificationModule(TINY, OPTIM, "stsb", 1)
    data = {**batch([6, 9, 12, 7]), "labels": torch.tensor([0.5, 4.0, 2.5, 1.0])}
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss = module._loss(module(data), data["labels"])
        first = first if first is not None else loss.item()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.1 * first


def test_a_training_step_reads_no_scalar_from_the_device(monkeypatch):
    """No host sync in a fine-tuning step: its padding counts stay on the device until the epoch ends."""
    monkeypatch.setattr("bert_repro.speed.kernels.eager_cpu", lambda x: False)  # as on a GPU
    monkeypatch.setattr(SequenceClassificationModule, "log", lambda *a, **k: None)
    module = SequenceClassificationModule(TINY, OPTIM, "mrpc", 2)
    data = {**batch([6, 9, 12, 7]), "labels": torch.tensor([0, 1, 1, 0])}
    with ScalarReads() as reads:
        module.training_step(data, 0).backward()
    assert reads.ops == [], reads.ops


def test_majority_class_and_wrong_label_counts():
    module = SequenceClassificationModule(TINY, OPTIM, "wnli", 2, predict_majority=True)
    module.trainer = SimpleNamespace(
        datamodule=SimpleNamespace(train_label_counts=lambda: np.array([312, 323])))
    module.setup("validate")
    assert module(batch([4, 6, 3])).argmax(-1).tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="task=stsb has 1 label"):
        SequenceClassificationModule(TINY, OPTIM, "stsb", 2)
    with pytest.raises(ValueError, match="unknown GLUE task"):
        SequenceClassificationModule(TINY, OPTIM, "glue", 2)
