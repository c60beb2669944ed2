"""Task heads on top of the encoder (model.py). Parameter names outside ``bert.`` are the heads, which
a pre-trained checkpoint does not hold: ``load_pretrained`` reports them as randomly initialised. ``speed``:
the trainer's SpeedOptions, for the encoder and the heads' dropout (model.py)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bert_repro.model import PLAIN, BertConfig, BertModel, Dropout, init_weights
from bert_repro.speed import SpeedOptions


def aggregate_token(sequence: Tensor, attention_mask: Tensor, causal: bool) -> Tensor:
    """The position whose final hidden state represents the whole input: [CLS] (§3.2, "C"), or for a
    left-to-right encoder (§5.1) the last real token, the only one that has seen everything (as OpenAI
    GPT classifies); a causal [CLS] sees only itself. (B, T, H) -> (B, H)."""
    if not causal:
        return sequence[:, 0]
    last = attention_mask.sum(dim=1) - 1  # (B,)
    return sequence[torch.arange(sequence.shape[0], device=sequence.device), last]


def bilstm_widths(config: BertConfig, bilstm: bool = False, features: dict | None = None
                  ) -> list[tuple[int, int]]:
    """Each layer's (input, hidden a direction) of the BiLSTM a head adds over the encoder: FeatureTagger's
    two over the combined ``features`` (an ablation=feature_* node, with FeatureTagger's defaults), the one
    of Table 5's "+ BiLSTM" (``bilstm``) over the final hidden states, or none."""
    H = config.hidden_size
    if features:
        layers, hidden = features["layers"], features.get("lstm_hidden", 768)
        count = config.num_layers if layers == "all" else len(layers)
        width = H * (count if features.get("combine", "concat") == "concat" else 1)
        return [(width, hidden), (2 * hidden, hidden)]
    return [(H, H)] if bilstm else []


def plus_bilstm(config: BertConfig) -> nn.LSTM:
    """Table 5's "+ BiLSTM" (§5.1), randomly initialised."""
    ((width, hidden),) = bilstm_widths(config, bilstm=True)
    return nn.LSTM(width, hidden, batch_first=True, bidirectional=True)


class SequenceClassifier(nn.Module):
    """Encoder + the sentence(-pair) head of §4.1: C -> pooler -> dropout -> Linear(H, K); K = 1 regresses.

    ``bilstm``: Table 5's "+ BiLSTM" (§5.1): a randomly initialised one-layer BiLSTM (H per direction)
    over the encoder's outputs replaces the pooler; its final forward and backward states (2H) feed the
    linear layer. The BiLSTM sees right context, which is what that row of Table 5 tests.
    """

    def __init__(self, config: BertConfig, num_labels: int, bilstm: bool = False,
                 speed: SpeedOptions = PLAIN):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels={num_labels}: expected 1 (regression) or the number of classes")
        self.bert = BertModel(config, speed)
        self.lstm = plus_bilstm(config) if bilstm else None
        if bilstm:  # the BiLSTM's final states replace the pooled C; DDP wants every trained parameter used
            self.bert.pooler.requires_grad_(False)
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)  # §3.5: 0.1
        self.classifier = nn.Linear(config.hidden_size * (2 if bilstm else 1), num_labels)
        init_weights(self.classifier, config.initializer_range)  # N(0, 0.02), zero bias, as the released code

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        sequence = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.lstm is None:
            token = aggregate_token(sequence, attention_mask, self.bert.config.causal)  # (B, H)
            # (B, H): the pooler reads position 0 of what it is given
            features = self.bert.pooler(token[:, None])
        else:
            lengths = attention_mask.sum(dim=1).cpu()
            packed = pack_padded_sequence(sequence, lengths, batch_first=True, enforce_sorted=False)
            _, (h_n, _) = self.lstm(packed)  # h_n: (2, B, H), forward then backward
            features = torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, 2H)
        return self.classifier(self.dropout(features))  # (B, K)


def bilstm_outputs(lstm: nn.LSTM, sequence: Tensor, attention_mask: Tensor) -> Tensor:
    """A batch-first bidirectional LSTM over the real tokens only (padding packed away): (B, T, in) -> (B, T,
    2h)."""
    lengths = attention_mask.sum(dim=1).cpu()
    packed = pack_padded_sequence(sequence, lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=sequence.shape[1])[0]


class TokenTagger(nn.Module):
    """Encoder + the NER head of v1 §4.3: every final hidden state T_i -> dropout -> Linear(H, K); no CRF.

    ``bilstm``: Table 5's "+ BiLSTM" (§5.1) for tagging: a randomly initialised one-layer BiLSTM (H per
    direction) over the encoder's outputs, whose 2H output at each position feeds the linear layer.
    """

    def __init__(self, config: BertConfig, num_labels: int, bilstm: bool = False,
                 speed: SpeedOptions = PLAIN):
        super().__init__()
        self.bert = BertModel(config, speed)
        self.bert.pooler.requires_grad_(False)  # C is never read here; DDP wants every trained parameter used
        self.lstm = plus_bilstm(config) if bilstm else None
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)
        self.classifier = nn.Linear(config.hidden_size * (2 if bilstm else 1), num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        sequence = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.lstm is not None:
            sequence = bilstm_outputs(self.lstm, sequence, attention_mask)  # (B, T, 2H)
        return self.classifier(self.dropout(sequence))  # (B, T, K)


class FeatureTagger(nn.Module):
    """The feature-based approach (§5.4, Table 7): BERT's parameters frozen, the activations of ``layers``
    (indices into the hidden states: 0 = the embeddings' output, 1..L the layers, negative from the last;
    "all" = the L layers) combined by ``combine`` -- concat, sum, or weighted_sum (softmax-normalised learned
    weights, v2's "weighted sum") -- feed a randomly initialised two-layer BiLSTM of ``lstm_hidden`` units per
    direction (768 in §5.4), then dropout and Linear(2 x lstm_hidden, K). The frozen encoder always runs in
    eval mode (no dropout), as features extracted once would be."""

    COMBINE = ("concat", "sum", "weighted_sum")

    def __init__(self, config: BertConfig, num_labels: int, layers: list[int] | str, combine: str = "concat",
                 lstm_hidden: int = 768, speed: SpeedOptions = PLAIN):
        super().__init__()
        if combine not in self.COMBINE:
            raise ValueError(f"features.combine={combine!r}; expected one of {', '.join(self.COMBINE)}")
        L = config.num_layers
        chosen = list(range(1, L + 1)) if layers == "all" else list(layers)
        if not chosen or any(not -(L + 1) <= i <= L for i in chosen):
            raise ValueError(f"features.layers={layers}: expected 'all' or indices in [{-(L + 1)}, {L}] "
                             f"(0 = embeddings, 1..{L} = layers, negative from the last)")
        self.layers = [i % (L + 1) for i in chosen]
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"features.layers={layers} names a layer twice")
        self.combine = combine
        self.bert = BertModel(config, speed)
        self.bert.requires_grad_(False)
        self.layer_weights = (nn.Parameter(torch.zeros(len(self.layers))) if combine == "weighted_sum"
                              else None)
        features = {"layers": self.layers, "combine": combine, "lstm_hidden": lstm_hidden}
        (width, _), _ = bilstm_widths(config, features=features)
        self.lstm = nn.LSTM(width, lstm_hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)
        self.classifier = nn.Linear(2 * lstm_hidden, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def features(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The selected activations, combined: (B, T, H) or (B, T, len(layers) x H) for concat."""
        self.bert.eval()  # here, not in train(): Lightning sets each submodule's mode itself
        with torch.no_grad():
            hidden = self.bert(input_ids, token_type_ids, attention_mask,
                               output_hidden_states=True).hidden_states
        chosen = [hidden[i] for i in self.layers]
        if self.combine == "concat":
            return torch.cat(chosen, dim=-1)
        stacked = torch.stack(chosen)  # (n, B, T, H)
        if self.combine == "sum":
            return stacked.sum(dim=0)
        return torch.einsum("n,nbth->bth", self.layer_weights.softmax(dim=0), stacked)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        features = self.features(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(bilstm_outputs(self.lstm, features, attention_mask)))  # (B, T, K)
