"""NER module (v1 §4.3, §5.4): conlleval scoring of IOB1 and IOB2, one count per word across ranks, the frozen
encoder of the feature-based approach, every Table 7 layer selection, and the Table 5 heads."""

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from seqeval.metrics import f1_score
from seqeval.scheme import IOB1, IOB2

from bert_repro.data.conll import CONLL2003_LABELS, IGNORE, iob1_to_iob2
from bert_repro.metrics.conll import EntityF1, entity_scores
from bert_repro.tasks.tagging import TokenTaggingModule

from .conftest import CONF

SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2)
OPTIM = dict(lr=1e-2, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, warmup_steps=0, epochs=None)
FEATURE_ABLATIONS = sorted(p.stem for p in CONF.glob("ablation/feature_*.yaml"))


def test_iob1_and_iob2_score_alike_with_conlleval_semantics():
    gold_iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"], ["I-ORG", "O", "I-MISC", "B-MISC"]]
    pred_iob1 = [["I-PER", "I-PER", "I-PER", "O", "I-LOC"], ["I-ORG", "O", "I-MISC", "I-MISC"]]
    raw = entity_scores(gold_iob1, pred_iob1)
    converted = entity_scores([iob1_to_iob2(s) for s in gold_iob1], [iob1_to_iob2(s) for s in pred_iob1])
    # gold: PER, PER, LOC, ORG, MISC, MISC (6); predicted: PER(3 words), LOC, ORG, MISC(2 words) (4); right:
    # LOC, ORG
    assert raw["precision"] == converted["precision"] == pytest.approx(2 / 4)
    assert raw["recall"] == converted["recall"] == pytest.approx(2 / 6)
    assert raw["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    # seqeval's IOB1
    assert raw["f1"] == pytest.approx(f1_score(gold_iob1, pred_iob1, mode="strict", scheme=IOB1))
    # the mistake this guards against: IOB1 tags read as strict IOB2 lose every entity that opens with I-
    assert f1_score(gold_iob1, pred_iob1, mode="strict", scheme=IOB2) == 0.0
    assert raw["token_acc"] == pytest.approx(7 / 9)


def test_entity_metric_counts_each_word_once_and_rebuilds_sentences():
    """Windows of a sentence arrive in any order, and a repeated window (a distributed sampler's padding)
    twice."""
    per, i_per, o = (CONLL2003_LABELS.index(t) for t in ("B-PER", "I-PER", "O"))
    metric = EntityF1(CONLL2003_LABELS)
    t = torch.tensor
    metric.update(t([0, 0]), t([2, 3]), t([i_per, o]), t([i_per, o]))  # second window of sentence 0
    metric.update(t([0, 0, 1]), t([0, 1, 0]), t([o, per, per]), t([o, per, per]))
    metric.update(t([0, 0]), t([2, 3]), t([i_per, o]), t([i_per, o]))  # the same window again
    assert metric.compute() == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "token_acc": 1.0}
    metric.reset()
    metric.update(t([0, 0, 0]), t([0, 1, 2]), t([per, o, o]), t([per, i_per, o]))  # a 2-word PER cut short
    assert metric.compute()["f1"] == 0.0 and metric.compute()["token_acc"] == pytest.approx(2 / 3)


def batch_of(B=4, T=7, K=None):
    K = K or len(CONLL2003_LABELS)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, SHAPE["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0
    labels = torch.randint(0, K, (B, T), generator=g)
    labels[:, 0] = labels[:, -1] = IGNORE
    labels[mask == 0] = IGNORE
    word = torch.where(labels != IGNORE, torch.arange(T).expand(B, T), -1)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
            "labels": labels, "word": word, "sentence": torch.arange(B)}


def fit_steps(module, steps=3):
    data = [batch_of() for _ in range(steps)]
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))


def test_feature_mode_trains_only_the_bilstm_and_classifier():
    torch.manual_seed(0)
    module = TokenTaggingModule(SHAPE, OPTIM, features={"layers": [-4, -3, -2, -1], "combine": "concat",
                                                        "lstm_hidden": 16})
    assert not any(p.requires_grad for p in module.model.bert.parameters())
    encoder = {k: v.clone() for k, v in module.model.bert.state_dict().items()}
    heads = {k: v.clone() for k, v in module.model.state_dict().items() if not k.startswith("bert.")}
    modes = []
    module.model.lstm.register_forward_hook(lambda m, i, o: modes.append((module.model.bert.training,
                                                                          m.training)))
    fit_steps(module)
    assert modes == [(False, True)] * 3  # frozen features come without dropout; the BiLSTM trains
    for k, v in module.model.bert.state_dict().items():
        assert torch.equal(v, encoder[k]), k
    changed = [k for k, v in module.model.state_dict().items() if k in heads and not torch.equal(v, heads[k])]
    assert any(k.startswith("lstm.") for k in changed) and "classifier.weight" in changed
    trained = {id(p) for g in module.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    assert all(id(p) not in trained for p in module.model.bert.parameters())
    assert module.model.lstm.num_layers == 2 and module.model.lstm.bidirectional


def compose_cfg(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_every_table7_row_exists():
    assert FEATURE_ABLATIONS == ["feature_concat_last_four", "feature_embeddings", "feature_last",
                                 "feature_second_to_last", "feature_sum_all", "feature_sum_last_four"]


@pytest.mark.parametrize("ablation", FEATURE_ABLATIONS)
@pytest.mark.slow
def test_feature_ablation_composes_and_runs(ablation):
    cfg = compose_cfg(["task=conll2003", f"ablation={ablation}", "model=tiny"])
    # pre-training as none
    assert cfg.ablation.name == ablation and not cfg.ablation.bilstm and cfg.ablation.nsp
    assert cfg.ablation.features.lstm_hidden == 768  # §5.4
    features = {**OmegaConf.to_container(cfg.module.features), "lstm_hidden": 8}
    module = TokenTaggingModule(SHAPE, OPTIM, features=features)
    head = module.model
    expected = {"feature_embeddings": [0], "feature_second_to_last": [2], "feature_last": [3],
                "feature_sum_last_four": [0, 1, 2, 3], "feature_concat_last_four": [0, 1, 2, 3],
                "feature_sum_all": [1, 2, 3]}[ablation]
    assert head.layers == expected
    assert (head.layer_weights is not None) == ablation.startswith("feature_sum")  # v2: "weighted sum"
    batch = batch_of()
    logits = module(batch)
    assert logits.shape == (4, 7, len(CONLL2003_LABELS))
    module._loss(logits, batch["labels"]).backward()
    assert head.classifier.weight.grad is not None and all(p.grad is None for p in head.bert.parameters())
    if head.layer_weights is not None:
        assert head.layer_weights.grad is not None and head.layer_weights.grad.abs().sum() > 0


@pytest.mark.slow
def test_none_ablation_fine_tunes_and_bad_settings_are_refused():
    assert compose_cfg(["task=conll2003"]).module.features is None
    module = TokenTaggingModule(SHAPE, OPTIM)
    assert all(p.requires_grad for n, p in module.model.bert.named_parameters()
               if not n.startswith("pooler."))
    with pytest.raises(ValueError, match="already reads the frozen encoder"):
        TokenTaggingModule(SHAPE, OPTIM, features={"layers": [-1]}, bilstm=True)
    with pytest.raises(ValueError, match="features.layers=\\[7\\]"):
        TokenTaggingModule(SHAPE, OPTIM, features={"layers": [7]})
    with pytest.raises(ValueError, match="features.combine='mean'"):
        TokenTaggingModule(SHAPE, OPTIM, features={"layers": [-1], "combine": "mean"})


def test_table5_heads_causal_and_bilstm():
    """LTR & No NSP keeps its left-only attention when tagging; + BiLSTM adds a BiLSTM over the token
    outputs."""
    torch.manual_seed(0)
    causal = TokenTaggingModule({**SHAPE, "causal": True}, OPTIM).eval()
    batch = batch_of()
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][:, 4] = 5
    before, after = causal(batch), causal(changed)
    assert torch.allclose(before[:, :4], after[:, :4]) and not torch.allclose(before[:, 4:], after[:, 4:])
    bilstm = TokenTaggingModule(SHAPE, OPTIM, bilstm=True)
    assert bilstm.model.lstm.bidirectional and bilstm.model.classifier.in_features == 2 * SHAPE["hidden_size"]
    for module in (causal.train(), bilstm):
        module._loss(module(batch), batch["labels"]).backward()
        assert all(p.grad is not None for p in module.parameters() if p.requires_grad)  # none idle under DDP
    fit_steps(bilstm, steps=1)
