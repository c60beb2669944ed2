"""Task heads on top of the encoder (model.py). Parameter names outside ``bert.`` are the heads, which
a pre-trained checkpoint does not hold: ``load_pretrained`` reports them as randomly initialised."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from bert_repro.model import BertConfig, BertModel, init_weights


def aggregate_token(sequence: Tensor, attention_mask: Tensor, causal: bool) -> Tensor:
    """The position whose final hidden state represents the whole input: [CLS] (§3.2, "C"), or for a
    left-to-right encoder (§5.1) the last real token, the only one that has seen everything (as OpenAI
    GPT classifies); a causal [CLS] sees only itself. (B, T, H) -> (B, H)."""
    if not causal:
        return sequence[:, 0]
    last = attention_mask.sum(dim=1) - 1  # (B,)
    return sequence[torch.arange(sequence.shape[0], device=sequence.device), last]


class SequenceClassifier(nn.Module):
    """Encoder + the sentence(-pair) head of §4.1: C -> pooler -> dropout -> Linear(H, K); K = 1 regresses.

    ``bilstm``: Table 5's "+ BiLSTM" (§5.1): a randomly initialised one-layer BiLSTM (H per direction)
    over the encoder's outputs replaces the pooler; its final forward and backward states (2H) feed the
    linear layer. The BiLSTM sees right context, which is what that row of Table 5 tests.
    """

    def __init__(self, config: BertConfig, num_labels: int, bilstm: bool = False):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels={num_labels}: expected 1 (regression) or the number of classes")
        self.bert = BertModel(config)
        self.lstm = nn.LSTM(config.hidden_size, config.hidden_size, batch_first=True, bidirectional=True) \
            if bilstm else None
        self.dropout = nn.Dropout(config.hidden_dropout)  # §3.5: 0.1
        self.classifier = nn.Linear(config.hidden_size * (2 if bilstm else 1), num_labels)
        init_weights(self.classifier, config.initializer_range)  # N(0, 0.02), zero bias, as the released code

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        sequence = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.lstm is None:
            token = aggregate_token(sequence, attention_mask, self.bert.config.causal)  # (B, H)
            features = self.bert.pooler(token[:, None])  # (B, H): the pooler reads position 0 of what it is given
        else:
            lengths = attention_mask.sum(dim=1).cpu()
            packed = pack_padded_sequence(sequence, lengths, batch_first=True, enforce_sorted=False)
            _, (h_n, _) = self.lstm(packed)  # h_n: (2, B, H), forward then backward
            features = torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, 2H)
        return self.classifier(self.dropout(features))  # (B, K)
