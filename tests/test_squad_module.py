"""The span module: S and E as one Linear(H, 2), its loss, the causal (LTR) constraint and the + BiLSTM
head."""

import pytest
import torch
import torch.nn.functional as F

from bert_repro.convert import LoadedCheckpoint, load_checkpoint
from bert_repro.model import BertConfig
from bert_repro.tasks.span import SpanExtractionModule

TINY = dict(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2)


def batch(B=3, T=12):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 9:] = 0  # a padded row
    return {"input_ids": torch.randint(5, 100, (B, T), generator=g),
            "token_type_ids": (torch.arange(T) > 4).long().expand(B, T), "attention_mask": mask,
            "start_positions": torch.tensor([3, 0, 7]), "end_positions": torch.tensor([5, 0, 7])}


def test_span_layer_and_loss():
    module = SpanExtractionModule(TINY, {}, version=1).eval().requires_grad_(False)
    assert tuple(module.model.qa_outputs.weight.shape) == (2, 32)  # rows S and E (§4.2)
    b = batch()
    start, end = module(b)
    assert start.shape == end.shape == (3, 12)
    assert (start[0, 9:] == torch.finfo(start.dtype).min).all()  # padding is never a start or an end
    expected = (F.cross_entropy(start, b["start_positions"]) + F.cross_entropy(end, b["end_positions"])) / 2
    assert float(module._loss(start, end, b)) == pytest.approx(float(expected))
    hidden = module.model.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"]).last_hidden_state
    S, b_S = module.model.qa_outputs.weight[0], module.model.qa_outputs.bias[0]
    assert torch.allclose(start[1], hidden[1] @ S + b_S, atol=1e-6)  # S.T_i


def changed_logits(module):
    """Start logits of positions 0-5 before and after changing the token at position 8."""
    b = batch()
    before = module(b)[0][:, :6]
    b["input_ids"] = b["input_ids"].clone()
    b["input_ids"][:, 8] = 4
    return not torch.allclose(before, module(b)[0][:, :6])


def test_ltr_stays_left_to_right_and_bilstm_reads_right_context():
    """Table 5: "LTR & No NSP" keeps the left-only constraint at fine-tuning; "+ BiLSTM" adds right
    context."""
    torch.manual_seed(0)
    assert changed_logits(SpanExtractionModule(TINY, {}, version=1).eval())  # bidirectional
    assert not changed_logits(SpanExtractionModule({**TINY, "causal": True}, {}, version=1).eval())
    assert changed_logits(SpanExtractionModule({**TINY, "causal": True}, {}, version=1, bilstm=True).eval())


@pytest.mark.slow
def test_init_from_a_checkpoint(minilm_dir):
    loaded = load_checkpoint(minilm_dir)
    module = SpanExtractionModule(loaded.config.to_dict(), {}, version=2, bilstm=True)
    # the new, randomly initialised parameters
    assert module.load_pretrained(loaded) == ["lstm", "qa_outputs"]
    assert torch.equal(module.model.bert.embeddings.word_embeddings.weight,
                       loaded.state_dict["bert.embeddings.word_embeddings.weight"])
    causal = LoadedCheckpoint(BertConfig(**{**TINY, "causal": True}),
                              SpanExtractionModule({**TINY, "causal": True}, {}, 1)
                              .model.state_dict(), [], None, True, "ltr.ckpt")
    # a causal checkpoint is never fine-tuned bidirectionally, nor a bidirectional one causally
    with pytest.raises(ValueError, match="left-to-right"):
        SpanExtractionModule(TINY, {}, version=1).load_pretrained(causal)
    with pytest.raises(ValueError, match="model.causal"):
        causal_run = SpanExtractionModule({**loaded.config.to_dict(), "causal": True}, {}, 2, bilstm=True)
        causal_run.load_pretrained(loaded)


def test_null_threshold_travels_in_the_checkpoint():
    module = SpanExtractionModule(TINY, {}, version=2)
    module.null_threshold = -1.25
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    restored = SpanExtractionModule(TINY, {}, version=2)
    restored.on_load_checkpoint(checkpoint)
    assert restored.null_threshold == -1.25


@pytest.mark.parametrize("task, version, epochs, batch", [("squad_v1", 1, 3, 32), ("squad_v2", 2, 2, 48)])
@pytest.mark.slow
def test_task_configs_build_the_module_with_the_paper_defaults(task, version, epochs, batch):
    """conf/task/squad_*.yaml: §4.2 / v2 §4.3 hyper-parameters; ablation=ltr_no_nsp_bilstm reaches the
    module."""
    from hydra.utils import instantiate

    from .test_config import compose_cfg, resolved

    cfg = resolved(compose_cfg([f"task={task}", "model=tiny", "ablation=ltr_no_nsp_bilstm"]))
    assert (cfg["optim"]["lr"], cfg["optim"]["epochs"], cfg["data"]["batch_size"]) == (5e-5, epochs, batch)
    assert (cfg["data"]["max_seq_length"], cfg["data"]["doc_stride"],
            cfg["data"]["max_query_length"]) == (384, 128, 64)
    assert cfg["task"]["monitor"] == "val/f1" and "planned_in" not in cfg["task"]
    module = instantiate(cfg["module"], model=cfg["model"], optim=cfg["optim"])
    assert module.version == version and module.config.causal and module.model.lstm is not None
    assert (module.n_best_size, module.max_answer_length) == (20, 30)


@pytest.mark.slow
def test_dev_is_scored_from_the_loader_alone(tmp_path, shared_data, minilm_dir, caplog):
    """The module reads Dev from its batches, not from trainer.datamodule: validating on the loader alone (no
    datamodule attached) gives the metrics and predictions of validating through the datamodule, and a
    partly scored Dev is still reported."""
    import json
    import logging

    import lightning as L

    from bert_repro.data.squad import SquadDataModule

    from .helpers import VARIED

    data = SquadDataModule(2, squad_dir=str(shared_data / "squad_v2"), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "cache"), batch_size=4, max_seq_length=64, doc_stride=16,
                           max_query_length=16, max_dev_examples=7, max_train_examples=1)
    data.setup()
    torch.manual_seed(0)
    module = SpanExtractionModule(VARIED, {}, version=2)

    def validate(folder, limit=1.0, **loaders):
        trainer = L.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path / folder,
                            limit_val_batches=limit, enable_progress_bar=False, enable_model_summary=False)
        metrics = trainer.validate(module, verbose=False, **loaders)[0]
        return metrics, json.loads((tmp_path / folder / "nbest_predictions.json").read_text())

    through_datamodule = validate("dm", datamodule=data)
    alone = validate("alone", dataloaders=data.val_dataloader())
    assert "val/no_ans_f1" in alone[0] and len(alone[1]) == 7
    assert alone == through_datamodule
    with caplog.at_level(logging.WARNING, logger="bert_repro.tasks.span"):
        partial, nbest = validate("partial", limit=1, dataloaders=data.val_dataloader())
    assert f"scored {len(nbest)} of 7 dev questions" in caplog.text and len(nbest) < 7
