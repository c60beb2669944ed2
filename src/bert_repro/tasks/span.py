"""SQuAD fine-tuning (§4.2; v2 §4.3): a start vector S and an end vector E over the final hidden states;
P(start = i) = softmax_i(S.T_i), the same for the end with E; loss = the mean of the two cross-entropies.
Dev windows leave their top start / end logits, kept with what their batch carries for scoring (the question
and the passage tokens' offsets: data/squad.py's SpanCollator); at the end of validation they are gathered
over the ranks, de-duplicated, turned into answers (squad_eval.py) and scored with the official semantics."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn

from bert_repro import squad_eval
from bert_repro.heads import bilstm_outputs, plus_bilstm
from bert_repro.model import PLAIN, BertConfig, BertModel, init_weights
from bert_repro.speed import SpeedOptions
from bert_repro.squad_eval import Prediction, Window, WindowLogits
from bert_repro.tasks.base import BertTaskModule

log = logging.getLogger(__name__)


class SpanExtractor(nn.Module):
    """Encoder + S and E as one Linear(H, 2) over every final hidden state T_i (§4.2).

    ``bilstm``: Table 5's "+ BiLSTM" (§5.1): a randomly initialised one-layer BiLSTM (H per direction) over
    the encoder's token outputs, whose 2H output at each position feeds the span layer.
    """

    def __init__(self, config: BertConfig, bilstm: bool = False, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.bert = BertModel(config, speed)
        # C's pooler is never read here; DDP wants every trained parameter used
        self.bert.pooler.requires_grad_(False)
        self.lstm = plus_bilstm(config) if bilstm else None
        self.qa_outputs = nn.Linear(config.hidden_size * (2 if bilstm else 1), 2)  # rows: S, E
        init_weights(self.qa_outputs, config.initializer_range)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor,
                                                                                                  Tensor]:
        """Start and end logits (B, T), padding at the lowest float."""
        sequence = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.lstm is not None:
            sequence = bilstm_outputs(self.lstm, sequence, attention_mask)  # (B, T, 2H)
        logits = self.qa_outputs(sequence).float()  # (B, T, 2)
        logits = logits.masked_fill(attention_mask[..., None] == 0, torch.finfo(logits.dtype).min)
        return logits[..., 0], logits[..., 1]


class SpanExtractionModule(BertTaskModule):
    """One LightningModule for SQuAD v1.1 (``version=1``) and v2.0 (``version=2``).

    Metrics: val/exact_match, val/f1, val/loss; v2.0 also val/has_ans_*, val/no_ans_* (exact, f1),
    val/best_exact(_thresh), val/best_f1(_thresh) and val/null_threshold, the tau tuned on Dev for F1 at each
    validation that v2.0's answers (and val/exact_match, val/f1) use; the checkpoint saves it. Each
    validation writes predictions.json, nbest_predictions.json (and v2.0 null_odds.json) into the run folder.
    """

    def __init__(self, model: dict, optim: dict, version: int, bilstm: bool = False, n_best_size: int = 20,
                 max_answer_length: int = 30, vocab: list[str] | None = None, lowercase: bool = True,
                 speed: dict | None = None):
        super().__init__(model, optim, vocab, lowercase, speed)
        self.save_hyperparameters()
        if version not in (1, 2):
            raise ValueError(f"version={version!r}: expected 1 (SQuAD v1.1) or 2 (SQuAD v2.0)")
        if n_best_size < 1 or max_answer_length < 1:
            raise ValueError(f"n_best_size={n_best_size}, max_answer_length={max_answer_length}: expected "
                             "positive")
        self.version, self.n_best_size, self.max_answer_length = version, n_best_size, max_answer_length
        self.model = SpanExtractor(self.config, bilstm, self.speed)
        self.null_threshold: float | None = None  # v2.0: tau of the last validation
        self.history: list[dict] = []
        self._val_windows: list[dict[str, Any]] = []

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def _loss(self, start: Tensor, end: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        return (F.cross_entropy(start, batch["start_positions"], reduction=reduction)
                + F.cross_entropy(end, batch["end_positions"], reduction=reduction)) / 2

    # -- steps -------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(*self(batch), batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if "scoring" not in batch:
            raise ValueError("a SQuAD dev batch without its questions (no 'scoring'): validate on "
                             "SquadDataModule.val_dataloader(), whose SpanCollator carries them")
        start, end = self(batch)
        k = min(self.n_best_size, start.shape[1])
        start_logit, start_index = start.topk(k, dim=1)  # (B, k)
        end_logit, end_index = end.topk(k, dim=1)
        out = {"window": batch["window"], "start_index": start_index, "start_logit": start_logit,
               "end_index": end_index, "end_logit": end_logit, "null_start": start[:, 0],
               "null_end": end[:, 0], "loss": self._loss(start, end, batch, reduction="none")}
        self._val_windows.append({**{name: value.cpu().numpy() for name, value in out.items()},
                                  "scoring": batch["scoring"], "num_questions": batch["num_questions"]})

    def _gathered_windows(self) -> tuple[dict[int, dict[str, Any]], int]:
        """window -> its outputs and scoring fields, over all ranks (the repeats that pad the last rank's
        share are dropped), and the number of questions in the split."""
        local, self._val_windows = self._val_windows, []
        parts = [local]
        if self.trainer.world_size > 1:
            parts = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(parts, local)
        windows: dict[int, dict[str, Any]] = {}
        num_questions = 0
        for batch in (b for part in parts for b in part):
            num_questions = batch.pop("num_questions")
            for i, window in enumerate(batch["window"].tolist()):
                windows.setdefault(window, {name: value[i] for name, value in batch.items()})
        return windows, num_questions

    def _predictions(self, outputs: dict[int, dict[str, Any]],
                     num_questions: int) -> tuple[dict[str, Prediction], dict[str, list[str]]]:
        """Answers of every dev question with at least one window scored, and their gold answers; all that
        is read comes with the batches (SpanCollator's ``scoring``), never from the trainer's datamodule."""
        by_example: dict[int, list[tuple[WindowLogits, Window]]] = {}
        questions: dict[int, dict[str, Any]] = {}
        for window in sorted(outputs):
            o, s = outputs[window], outputs[window]["scoring"]
            logits = WindowLogits(o["start_index"], o["start_logit"], o["end_index"], o["end_logit"],
                                  float(o["null_start"]), float(o["null_end"]))
            by_example.setdefault(s["example"], []).append(
                (logits, Window(s["context_start"], s["offsets"], s["max_context"])))
            questions[s["example"]] = s
        if len(by_example) < num_questions and not self.trainer.sanity_checking:
            log.warning("squad_v%d: scored %d of %d dev questions (limit_val_batches)", self.version,
                        len(by_example), num_questions)
        predictions, answers = {}, {}
        for example in sorted(by_example):
            question = questions[example]
            predictions[question["id"]] = squad_eval.predict_question(
                question["context"], by_example[example], self.n_best_size, self.max_answer_length,
                with_null=self.version == 2)
            answers[question["id"]] = question["answers"]
        return predictions, answers

    def on_validation_epoch_end(self) -> None:
        outputs, num_questions = self._gathered_windows()
        if not outputs:
            return
        predictions, answers = self._predictions(outputs, num_questions)
        metrics, final, tau = squad_eval.score(answers, predictions, self.version)
        loss = sum(float(o["loss"]) for o in outputs.values()) / len(outputs)
        values = {"val/loss": loss, **{f"val/{name}": value for name, value in metrics.items()}}
        # the same on every rank: each scored the whole gathered dev set
        self.log_dict(values, sync_dist=True)
        if self.trainer.sanity_checking:
            return
        self.null_threshold = tau
        if self.trainer.is_global_zero:
            written = squad_eval.write_prediction_files(Path(self.trainer.default_root_dir), final,
                                                        predictions)
            log.info("squad_v%d: dev %s; wrote %s", self.version,
                     ", ".join(f"{k} {v:.2f}" for k, v in values.items()), ", ".join(p.name for p in written))
        if self.trainer.state.fn == TrainerFn.FITTING:
            self.history.append({"epoch": self.current_epoch, "step": self.global_step, **values})

    # -- checkpoints carry tau ---------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["null_threshold"] = self.null_threshold

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.null_threshold = checkpoint.get("null_threshold")
