"""The BERT encoder (Devlin et al., §3.1) in one readable file, and the forward pass every run executes.

Post-LayerNorm Transformer encoder with exact GELU, learned position embeddings and segment
embeddings, attention through ``torch.nn.functional.scaled_dot_product_attention``. The module
tree follows the Hugging Face / Google parameter vocabulary (``embeddings.word_embeddings``,
``encoder.layer.N.attention.LayerNorm`` ...) with a few shorter names (``attention.dense`` for
``attention.output.dense``, ``intermediate`` for ``intermediate.dense`` ...) and query, key and value
in one fused ``qkv`` projection (one GEMM instead of three); ``convert/names.py`` maps between the two.

Speed (trainer/'s ``SpeedOptions``, passed to the constructors) never forks this path: speed/layout.py
decides once per forward where the tokens sit (padded, or only the real ones) and which attention kernel runs,
and model.py calls speed/ at one place per feature, each tested equal to the plain path
(tests/test_speed_options.py). The block itself is ``Layer.forward``: edit it there (e.g. for a pre-LN
encoder) and every run, fast or plain, runs the edit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from bert_repro.config import ModelConfig, problems, whole_positive
from bert_repro.speed import SpeedOptions, kernels, layout
from bert_repro.speed.layout import AttentionContext
from bert_repro.speed.loss import decode, fusable, linear_cross_entropy

PLAIN = SpeedOptions()  # every speed option off


@dataclass
class BertConfig(ModelConfig):
    """Encoder shape and regularisation: conf/'s ``model`` node (schema.ModelConfig, which declares each
    field's default, BERT-base, and range) with the tokenizer's vocabulary size."""

    vocab_size: int = whole_positive(30522, "tokens")

    def __post_init__(self) -> None:
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size  # as in the paper (§3.1, footnote)
        wrong = problems(self, "model")
        if wrong:
            raise ValueError(wrong[0])

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, T, H)
    hidden_states: list[Tensor] | None = None  # embeddings output + every layer: L + 1 tensors of (B, T, H)


class Dropout(nn.Dropout):
    """nn.Dropout; with ``cpu_kernel`` (speed.fast_kernels) a CPU training step draws its mask with
    ``kernels.dropout``: the same keep-with-1-p and 1/(1-p) scale, cheaper than ATen's serial draws."""

    def __init__(self, p: float, cpu_kernel: bool = False):
        super().__init__(p)
        self.cpu_kernel = cpu_kernel

    def forward(self, x: Tensor) -> Tensor:
        if self.cpu_kernel and self.training and 0.0 < self.p < 1.0 and kernels.eager_cpu(x):
            return kernels.dropout(x, self.p)
        return super().forward(x)


class Embeddings(nn.Module):
    """Token + segment + learned position embeddings, then LayerNorm and dropout (§3.2, Figure 2)."""

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)
        self.max_position = config.max_position

    def forward(self, input_ids: Tensor, token_type_ids: Tensor,
                position_ids: Tensor | None = None) -> Tensor:
        """``position_ids`` default to 0..T-1; packed rows (speed.pack) restart them at each instance."""
        seq_len = input_ids.shape[-1]
        if seq_len > self.max_position:
            raise ValueError(f"sequence length {seq_len} exceeds max_position {self.max_position}")
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device)  # (T,)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention (one fused QKV projection), and the parameters of its output sub-step
    (``dense``, ``dropout``, ``LayerNorm``: the google-research/bert names), which ``Layer`` applies."""

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)
        self.attention_dropout = config.attention_dropout

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """The heads' context at ctx's query rows: (B, T, H) -> (B, T|P, H); (N, H) -> (N, H) | (B, P, H)."""
        heads = (self.num_heads, self.head_dim)
        if ctx.rows is None:
            q, k, v = self.qkv(x).unflatten(-1, (3, *heads)).unbind(-3)  # 3 x (..., heads, head_dim)
        else:  # the sparse last layer: the query projection at its P rows only
            q, k, v = layout.sparse_qkv(self.qkv, x, ctx, heads)
        dropout_p = self.attention_dropout if self.training else 0.0
        return layout.attend(q, k, v, ctx, dropout_p).flatten(-2)  # (..., H)


class Layer(nn.Module):
    """One encoder block (§3.1): self-attention, then the 4H feed-forward; each sub-layer's output goes
    through dropout, the residual and LayerNorm (post-LN, as the paper and the released checkpoints)."""

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.attention = SelfAttention(config, speed)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout, speed.fast_kernels)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """x: (B, T, H), or the real tokens (N, H) unpadded; out: ctx's query rows (all but in the sparse
        last layer, where (B, P, H)). Every run executes this block, whatever its speed options."""
        a = self.attention
        x = a.LayerNorm(ctx.select(x) + a.dropout(a.dense(a(x, ctx))))  # (..., H), post-LN (Vaswani et al.)
        h = F.gelu(self.intermediate(x))  # (..., 4H); exact (erf) GELU, as the released checkpoints are run
        return self.LayerNorm(x + self.dropout(self.output(h)))  # (..., H)


class Encoder(nn.Module):
    """The L layers (§3.1). ``speed.activation_checkpointing`` recomputes each in the backward pass (memory
    for compute); each layer stays a module call, so FSDP's per-layer units wrap it."""

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config, speed) for _ in range(config.num_layers))
        self.checkpointing = speed.activation_checkpointing

    def forward(self, x: Tensor, ctx: AttentionContext, output_hidden_states: bool = False) -> EncoderOutput:
        """With ctx's positions (B, P), the sparse last layer's queries, feed-forward and LayerNorms run at
        those P positions only: the output is then (B, P, H)."""
        hidden_states = [ctx.pad(x)] if output_hidden_states else None
        for i, layer in enumerate(self.layer):
            if i == len(self.layer) - 1:
                x, ctx = ctx.last_layer(x)
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(layer, x, ctx, use_reentrant=False)
            else:
                x = layer(x, ctx)  # (B, T|P, H) or (N, H)
            if hidden_states is not None:
                hidden_states.append(ctx.pad(x))
        return EncoderOutput(last_hidden_state=ctx.pad(x), hidden_states=hidden_states)


class Pooler(nn.Module):
    """tanh(W C + b) on the final hidden state of [CLS] (§3.2: C, the aggregate representation)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: Tensor) -> Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))  # (B, H)


class BertModel(nn.Module):
    """Embeddings + encoder + pooler. ``forward`` returns the sequence; heads that need C call ``pooler``."""

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.config, self.speed = config, speed
        self.embeddings = Embeddings(config, speed)
        self.encoder = Encoder(config, speed)
        self.pooler = Pooler(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, output_hidden_states: bool = False,
                output_positions: Tensor | None = None, sequence_ids: Tensor | None = None,
                position_ids: Tensor | None = None) -> EncoderOutput:
        """``input_ids`` (B, T); ``attention_mask`` (B, T): 1 = real token, 0 = padding. ``output_positions``
        (B, P): only those leave the last layer (Encoder). ``sequence_ids``/``position_ids`` (B, T): packed
        rows (speed/packing.py), 1, 2, ... per instance (0 at padding) and positions restarting at each."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        ctx = layout.context(self.speed, self.config.causal, attention_mask, input_ids.shape[1], sequence_ids,
                             output_positions)
        return self.encoder(ctx.unpad(x), ctx, output_hidden_states)  # unpadded: (N, H) to the head


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

    def __init__(self, config: BertConfig, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.kernels = speed.fast_kernels

    def transform(self, hidden: Tensor) -> Tensor:
        """dense + GELU + LayerNorm before the decoder (google-research/bert's cls/predictions/transform)."""
        return self.LayerNorm(F.gelu(self.dense(hidden)))  # (..., H)

    def forward(self, hidden: Tensor, decoder_weight: Tensor) -> Tensor:
        """``decoder_weight`` is the word-embedding matrix (V, H): tied, so it is passed, not owned."""
        if self.kernels:  # the same logits, a cheaper tied-weight gradient (speed/loss.py)
            return decode(self.transform(hidden), decoder_weight, self.bias)
        return F.linear(self.transform(hidden), decoder_weight, self.bias)  # (..., V)

    def loss(self, hidden: Tensor, decoder_weight: Tensor, targets: Tensor) -> tuple[Tensor, Tensor] | None:
        """(mean cross-entropy, hits) of ``hidden`` (N, H) against ``targets`` (N,), the decoder fused into
        the loss: no (N, V) logits (speed/loss.py). In CPU training steps with speed.fast_kernels; else
        None."""
        if not (self.kernels and fusable(hidden)):
            return None
        return linear_cross_entropy(self.transform(hidden), decoder_weight, self.bias, targets)


class BertForPreTraining(nn.Module):
    """Encoder + MLM head + (optionally) the NSP head on the pooled [CLS] (§3.3)."""

    def __init__(self, config: BertConfig, nsp: bool = True, speed: SpeedOptions = PLAIN):
        super().__init__()
        self.config, self.speed = config, speed
        self.bert = BertModel(config, speed)
        self.mlm = MLMHead(config, speed)
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
        mlm_targets: Tensor | None = None,
    ) -> PreTrainingOutput:
        """MLM logits at ``masked_positions`` (B, P) when given, else at every position; only those meet
        the vocabulary projection (google-research/bert gathers them too). ``prediction_mask`` (B, P)
        marks the real predictions among them; the logits are then (N, V) for its N True entries.
        ``mlm_targets`` (N,), their tokens, let speed.fast_kernels fuse the decoder with the loss
        (``heads``)."""
        fast = None if masked_positions is None else layout.prediction_states(
            self.bert, input_ids, token_type_ids, attention_mask, masked_positions, output_hidden_states)
        if fast is not None:  # packed rows or the sparse last layer: [CLS] (B, 1, H) and the positions
            seq, predicted, hidden_states = fast
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
            seq = predicted = out.last_hidden_state  # (B, T, H)
            hidden_states = out.hidden_states
            if masked_positions is not None:
                index = masked_positions.unsqueeze(-1).expand(-1, -1, seq.shape[-1])  # (B, P, H)
                predicted = seq.gather(1, index)  # (B, P, H)
        return self.heads(predicted, seq, prediction_mask, hidden_states, mlm_targets)

    def heads(self, predicted: Tensor, seq: Tensor, prediction_mask: Tensor | None = None,
              hidden_states: list[Tensor] | None = None,
              mlm_targets: Tensor | None = None) -> PreTrainingOutput:
        """MLM logits of the ``predicted`` states (B, P|T, H), of only ``prediction_mask``'s when given, and
        NSP logits of the first state of ``seq``, [CLS]. Given ``mlm_targets``, a step the fused decoder
        takes (MLMHead.loss) returns the MLM loss and hits in place of the logits."""
        if prediction_mask is not None:
            predicted = predicted[prediction_mask]  # (N, H)
        decoder = self.bert.embeddings.word_embeddings.weight  # (V, H): tied
        nsp_logits = self.nsp(self.bert.pooler(seq)) if self.nsp is not None else None  # (B, 2)
        fused = None if mlm_targets is None else self.mlm.loss(predicted.flatten(0, -2), decoder, mlm_targets)
        if fused is not None:
            return PreTrainingOutput(None, nsp_logits, seq, hidden_states, *fused)
        mlm_logits = self.mlm(predicted, decoder)  # (B, P|T, V) or (N, V)
        return PreTrainingOutput(mlm_logits, nsp_logits, seq, hidden_states)


@dataclass
class PreTrainingOutput:
    mlm_logits: Tensor | None  # (B, P, V), (B, T, V), or (N, V) with a prediction mask
    nsp_logits: Tensor | None  # (B, 2)
    last_hidden_state: Tensor  # (B, T, H); the sparse last layer: [CLS] and the positions (B, 1+P, H)
    hidden_states: list[Tensor] | None = None
    # the fused decoder and loss (MLMHead.loss), given targets: in place of the logits
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


def checkpoint_parameters(config: BertConfig, pretraining: bool) -> int:
    """count_parameters of what a checkpoint of ``config`` holds, BertForPreTraining or (a fine-tuning's) the
    encoder, built on the meta device: no memory, no initialisation (the plan's disk and all-reduce)."""
    with torch.device("meta"):
        module = BertForPreTraining(config) if pretraining else BertModel(config)
    return count_parameters(module)
