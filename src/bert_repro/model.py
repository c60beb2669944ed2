"""The BERT encoder (Devlin et al., §3.1) in one readable file.

Post-LayerNorm Transformer encoder with exact GELU, learned position embeddings and segment
embeddings, attention through ``torch.nn.functional.scaled_dot_product_attention``. The module
tree follows the Hugging Face / Google parameter vocabulary (``embeddings.word_embeddings``,
``encoder.layer.N.attention.LayerNorm`` ...) with a few shorter names (``attention.dense`` for
``attention.output.dense``, ``intermediate`` for ``intermediate.dense`` ...) and query, key and value
in one fused ``qkv`` projection (one GEMM instead of three); ``convert.py``'s table maps between the two.
Speed (CPU kernels, unpadding, packing, the sparse last layer) lives in ``bert_repro.speed``, which runs
these same parameters and is tested equal to this path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class BertConfig:
    """Encoder shape and regularisation. Defaults are BERT-base (§3.1: L=12, H=768, A=12)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int | None = None  # None -> 4H, as in the paper (§3.1, footnote)
    max_position: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1  # §3.5: dropout 0.1 on all layers
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12  # google-research/bert's LayerNorm epsilon
    initializer_range: float = 0.02
    causal: bool = False  # left-to-right ablation (§5.1): each position sees only its left context

    def __post_init__(self) -> None:
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "max_position", "type_vocab_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}); e.g. H=768 works with A=3, 4, 6, 12"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise ValueError("BertConfig.layer_norm_eps and initializer_range must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, T, H)
    hidden_states: list[Tensor] | None = None  # embeddings output + every layer: L + 1 tensors of (B, T, H)


class Embeddings(nn.Module):
    """Token + segment + learned position embeddings, then LayerNorm and dropout (§3.2, Figure 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.max_position = config.max_position

    def forward(self, input_ids: Tensor, token_type_ids: Tensor,
                position_ids: Tensor | None = None) -> Tensor:
        """``position_ids`` default to 0..T-1; packed rows (speed/) restart them at each instance."""
        seq_len = input_ids.shape[-1]
        if seq_len > self.max_position:
            raise ValueError(f"sequence length {seq_len} exceeds max_position {self.max_position}")
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device)  # (T,)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention (one fused QKV projection), then the residual and LayerNorm (§3.1)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.attention_dropout = config.attention_dropout
        self.causal = config.causal

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """``mask``: boolean (B, 1, T|1, T), True = may attend, or None (nothing masked)."""
        B, T, H = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, heads, T, head_dim)
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.attention_dropout if self.training else 0.0,
            is_causal=self.causal and mask is None)  # (B, heads, T, head_dim)
        context = context.transpose(1, 2).reshape(B, T, H)  # (B, T, H)
        return self.LayerNorm(x + self.dropout(self.dense(context)))  # post-LN (Vaswani et al.)


class Layer(nn.Module):
    """One encoder block: attention sub-layer, then the 4H feed-forward sub-layer, each post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = self.attention(x, mask)  # (B, T, H)
        h = F.gelu(self.intermediate(x))  # (B, T, 4H); exact (erf) GELU, as the released checkpoints are run
        return self.LayerNorm(x + self.dropout(self.output(h)))  # (B, T, H)


class Encoder(nn.Module):
    """The L layers (§3.1)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_layers))

    def forward(self, x: Tensor, mask: Tensor | None, output_hidden_states: bool = False) -> EncoderOutput:
        hidden_states = [x] if output_hidden_states else None
        for layer in self.layer:
            x = layer(x, mask)  # (B, T, H)
            if hidden_states is not None:
                hidden_states.append(x)
        return EncoderOutput(last_hidden_state=x, hidden_states=hidden_states)


class Pooler(nn.Module):
    """tanh(W C + b) on the final hidden state of [CLS] (§3.2: C, the aggregate representation)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: Tensor) -> Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))  # (B, H)


def attention_mask_for_sdpa(attention_mask: Tensor | None, causal: bool, seq_len: int) -> Tensor | None:
    """Padding mask (B, T) of 1 = real, 0 = pad -> boolean SDPA mask (B, 1, 1|T, T), True = may attend.

    None when nothing needs masking, so SDPA can take its fastest kernel (and apply the causal mask of
    the left-to-right ablation itself, through ``is_causal``)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        keys = torch.arange(seq_len, device=attention_mask.device)
        mask = mask & (keys <= keys[:, None])  # (B, 1, T, T): padding and the future
    return mask


class BertModel(nn.Module):
    """Embeddings + encoder + pooler. ``forward`` returns the sequence; heads that need C call ``pooler``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, output_hidden_states: bool = False) -> EncoderOutput:
        """``input_ids`` (B, T); ``attention_mask`` (B, T): 1 = real token, 0 = padding."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        mask = attention_mask_for_sdpa(attention_mask, self.config.causal, input_ids.shape[1])
        return self.encoder(x, mask, output_hidden_states)


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: truncated-normal-like N(0, 0.02) weights, zero biases, LayerNorm 1/0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class MLMHead(nn.Module):
    """Masked-LM head (§3.3.1): dense + GELU + LayerNorm, then the decoder tied to the word embeddings."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def transform(self, hidden: Tensor) -> Tensor:
        """dense + GELU + LayerNorm before the decoder (google-research/bert's cls/predictions/transform)."""
        return self.LayerNorm(F.gelu(self.dense(hidden)))  # (..., H)

    def forward(self, hidden: Tensor, decoder_weight: Tensor) -> Tensor:
        """``decoder_weight`` is the word-embedding matrix (V, H): tied, so it is passed, not owned."""
        return F.linear(self.transform(hidden), decoder_weight, self.bias)  # (..., V)


class BertForPreTraining(nn.Module):
    """Encoder + MLM head + (optionally) the NSP head on the pooled [CLS] (§3.3)."""

    def __init__(self, config: BertConfig, nsp: bool = True):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2) if nsp else None
        for module in (self.mlm, self.nsp):
            if module is not None:
                module.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        masked_positions: Tensor | None = None,
        prediction_mask: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> PreTrainingOutput:
        """MLM logits at ``masked_positions`` (B, P) when given, else at every position; only those meet
        the vocabulary projection (google-research/bert gathers them too). ``prediction_mask`` (B, P)
        marks the real predictions among them; the logits are then (N, V) for its N True entries."""
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
        seq = out.last_hidden_state  # (B, T, H)
        predicted = seq
        if masked_positions is not None:
            index = masked_positions.unsqueeze(-1).expand(-1, -1, seq.shape[-1])  # (B, P, H)
            predicted = seq.gather(1, index)  # (B, P, H)
        return self.heads(predicted, seq, prediction_mask, out.hidden_states)

    def heads(self, predicted: Tensor, seq: Tensor, prediction_mask: Tensor | None = None,
              hidden_states: list[Tensor] | None = None) -> PreTrainingOutput:
        """MLM logits of the ``predicted`` states (B, P|T, H), of only ``prediction_mask``'s when given, and
        NSP logits of the first state of ``seq``, [CLS]."""
        if prediction_mask is not None:
            predicted = predicted[prediction_mask]  # (N, H)
        mlm_logits = self.mlm(predicted, self.bert.embeddings.word_embeddings.weight)  # (B, P|T, V) or (N, V)
        nsp_logits = self.nsp(self.bert.pooler(seq)) if self.nsp is not None else None  # (B, 2)
        return PreTrainingOutput(mlm_logits, nsp_logits, seq, hidden_states)


@dataclass
class PreTrainingOutput:
    mlm_logits: Tensor | None  # (B, P, V), (B, T, V), or (N, V) with a prediction mask
    nsp_logits: Tensor | None  # (B, 2)
    last_hidden_state: Tensor  # (B, T, H); speed's sparse last layer: ([CLS] and) the positions (B, [1+]P, H)
    hidden_states: list[Tensor] | None = None
    # the speed path's fused decoder and loss (bert_repro.speed.loss), given targets: in place of the logits
    mlm_loss: Tensor | None = None  # mean cross-entropy over the N predictions
    mlm_correct: Tensor | None = None  # how many of their argmaxes hit


def count_parameters(module: nn.Module, non_embedding: bool = False) -> int:
    """Unique parameters (tied weights counted once); ``non_embedding`` drops the embedding tables."""
    params = {id(p): p for p in module.parameters()}
    if non_embedding:
        for m in module.modules():
            if isinstance(m, nn.Embedding):
                params.pop(id(m.weight), None)
    return sum(p.numel() for p in params.values())
