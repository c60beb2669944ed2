"""The parity check: our encoder against transformers' on real sentences, layer by layer."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from bert_repro.convert.loaders import LoadedCheckpoint, build_model

SENTENCES = [
    ("The quick brown fox jumps over the lazy dog.", "It was not amused."),
    ("BERT is pre-trained on BooksCorpus and English Wikipedia.", "Fine-tuning takes an hour on a TPU."),
    ("Paris is the capital of France.", "The Eiffel Tower was completed in 1889."),
    ("Hello world!", "Short."),
]


def sentence_batch(loaded: LoadedCheckpoint) -> dict[str, Tensor]:
    """The sentence pairs through the checkpoint's own vocabulary, right-padded to the longest.

    A checkpoint without a vocabulary gets random ids with the same lengths (and a note saying so).
    """
    from bert_repro.tokenization import tokenizer_from_vocab

    if loaded.vocab is None:
        print(f"note: {loaded.source} has no vocabulary; comparing on random token ids")
        lengths = torch.tensor([7, 16, 12, 5])
        ids = torch.randint(0, loaded.config.vocab_size, (len(lengths), int(lengths.max())),
                            generator=torch.Generator().manual_seed(0))
        mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
        return {"input_ids": ids * mask, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
    tokenizer = tokenizer_from_vocab(loaded.vocab, lowercase=loaded.lowercase is not False)
    tokenizer.enable_padding(pad_id=loaded.vocab.index("[PAD]"))
    encodings = tokenizer.encode_batch(SENTENCES)
    return {"input_ids": torch.tensor([e.ids for e in encodings]),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings])}


@torch.no_grad()
def compare_with_transformers(loaded: LoadedCheckpoint, hf_dir: Path) -> list[tuple[str, float]]:
    """Max |ours - transformers| at real (non-pad) positions: embeddings, each layer, pooled, heads."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    with_mlm = "mlm" not in loaded.missing_heads
    cls = transformers.BertForPreTraining if with_mlm else transformers.BertModel
    theirs = cls.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    ours = build_model(loaded, nsp="nsp" not in loaded.missing_heads).eval()
    batch = sentence_batch(loaded)
    real = batch["attention_mask"].bool()
    mine = ours(**batch, output_hidden_states=True)
    ref = theirs(**batch, output_hidden_states=True)
    rows = [(f"layer {i}" if i else "embeddings", (a - b)[real].abs().max().item())
            for i, (a, b) in enumerate(zip(mine.hidden_states, ref.hidden_states, strict=True))]
    base = theirs.bert if with_mlm else theirs
    pooled = base.pooler(ref.hidden_states[-1])
    rows.append(("pooled", (ours.bert.pooler(mine.last_hidden_state) - pooled).abs().max().item()))
    if with_mlm:
        rows.append(("mlm logits", (mine.mlm_logits - ref.prediction_logits)[real].abs().max().item()))
        if mine.nsp_logits is not None:
            rows.append(("nsp logits", (mine.nsp_logits - ref.seq_relationship_logits).abs().max().item()))
    return rows


@torch.no_grad()
def compare_task_with_transformers(module, architecture: str, hf_dir: Path,
                                   batch: dict[str, Tensor]) -> list[tuple[str, float]]:
    """Max |ours - transformers| of a fine-tuned model's task outputs (``export_finetuned``'s ``hf_dir``)
    at real positions. Multiple choice reads the batch's sequences as the choices of one example."""
    import transformers

    theirs = getattr(transformers, architecture).from_pretrained(str(hf_dir), attn_implementation="eager")
    theirs.eval()
    module.eval()
    if architecture == "BertForMultipleChoice":
        rows = torch.arange(module.num_choices) % batch["input_ids"].shape[0]
        batch = {k: v[rows][None] for k, v in batch.items()}  # (1, N, T)
    real = batch["attention_mask"].bool()
    mine, ref = module(batch), theirs(**batch)
    if architecture == "BertForQuestionAnswering":
        return [("start logits", (mine[0] - ref.start_logits)[real].abs().max().item()),
                ("end logits", (mine[1] - ref.end_logits)[real].abs().max().item())]
    if architecture == "BertForTokenClassification":
        return [("task logits", (mine - ref.logits)[real].abs().max().item())]
    return [("task logits", (mine - ref.logits.view(mine.shape)).abs().max().item())]  # STS-B: (B,), (B, 1)
