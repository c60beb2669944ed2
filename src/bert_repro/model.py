"""The BERT encoder (Devlin et al., §3.1) in one readable file, and the forward pass every run executes.

Post-LayerNorm Transformer encoder with exact GELU, learned position embeddings and segment
embeddings, attention through ``torch.nn.functional.scaled_dot_product_attention``. The module
tree follows the Hugging Face / Google parameter vocabulary (``embeddings.word_embeddings``,
``encoder.layer.N.attention.LayerNorm`` ...) with a few shorter names (``attention.dense`` for
``attention.output.dense``, ``intermediate`` for ``intermediate.dense`` ...) and query, key and value
in one fused ``qkv`` projection (one GEMM instead of three); ``convert/names.py`` maps between the two.

Speed (trainer/'s ``SpeedOptions``, passed to the constructors) never forks this path; it changes how a step
runs at one switch point per feature, each tested equal to the plain path (tests/test_speed_options.py):
``Dropout`` (the CPU dropout kernel), ``attend`` (SDPA, or varlen attention on the real tokens), the
``AttentionContext`` a forward builds once (padded or unpadded rows, the sparse last layer's queries),
``Encoder`` (activation checkpointing), ``BertForPreTraining.forward`` (packed rows, the sparse last layer)
and its ``heads`` (the fused MLM decoder and loss). The block itself is ``Layer.forward``: edit it there
(e.g. for a pre-LN encoder) and every run, fast or plain, runs the edit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from bert_repro.config import ModelConfig, problems, whole_positive
from bert_repro.speed import SpeedOptions, kernels
from bert_repro.speed.kernels import Packed, varlen_attention
from bert_repro.speed.loss import decode, fusable, linear_cross_entropy
from bert_repro.speed.packing import block_diagonal_mask, pack_rows, read_back

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
    ``kernels.dropout``: the same keep-with-1-p and 1/(1-p) scale, 2.6x cheaper than ATen's serial draws."""

    def __init__(self, p: float, cpu_kernel: bool = False):
        super().__init__(p)
        self.cpu_kernel = cpu_kernel

    def forward(self, x: Tensor) -> Tensor:
        if self.cpu_kernel and self.training and 0.0 < self.p < 1.0 and x.device.type == "cpu":
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


@dataclass
class AttentionContext:
    """How every layer's attention runs on this batch, decided once per forward (``BertModel.context``).
    Padded, the layers see (B, T, H) and SDPA takes ``mask``; unpadded (speed.unpad, as MosaicBERT and
    ModernBERT), they see the real tokens (N, H), and ``packed`` says which sequence each is in (cu_seqlens).
    ``rows``, in the sparse last layer only: its query rows (B, P), the only ones that leave it."""

    speed: SpeedOptions
    causal: bool  # the left-to-right ablation (§5.1)
    attention_mask: Tensor | None  # (B, T) as given: 1 = real, 0 = padding
    mask: Tensor | None = None  # padded: boolean (B, 1, 1|T|P, T), True = may attend; None = nothing masked
    packed: Packed | None = None  # unpadded: the real tokens' places and sequences
    rows: tuple[Tensor, ...] | None = None  # an index of x's leading dimensions giving (B, P)

    @property
    def is_causal(self) -> bool:  # SDPA applies the causal mask itself when nothing else is masked
        return self.causal and self.mask is None and self.rows is None

    def select(self, x: Tensor) -> Tensor:
        """x's query rows: all of them, or the sparse last layer's (B, P, ...)."""
        return x if self.rows is None else x[self.rows]

    def pad(self, x: Tensor) -> Tensor:
        """Unpadded (N, H) back to the batch's (B, T, H), zeros at the padding; other shapes as they are."""
        return self.packed.pad(x) if self.packed is not None and x.dim() == 2 else x

    def sparse(self, x: Tensor, positions: Tensor) -> tuple[Tensor, AttentionContext]:
        """The sparse last layer's input and context: queries at ``positions`` (B, P), keys everywhere."""
        packed = self.packed
        if packed is not None and not self.causal and packed.num_sequences == len(positions):
            return x, replace(self, rows=(packed.rows(positions),))  # row b's queries over its real tokens
        x = self.pad(x)  # (B, T, H): varlen queries apart from their keys: never causal nor of empty rows
        mask = attention_mask_for_sdpa(self.attention_mask, self.causal, x.shape[1], positions)
        batch = torch.arange(len(positions), device=positions.device)[:, None]  # (B, 1)
        return x, replace(self, mask=mask, packed=None, rows=(batch, positions))


def attend(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(d)) v per head (Vaswani et al.), token-major: q (..., heads, d) at ctx's query
    rows, k and v (..., heads, d) at every row; the context comes back shaped as q. The one switch between
    attention kernels: SDPA on the padded batch (with speed.fast_kernels, its math with the cheap CPU dropout
    mask), or, unpadded, attention within each sequence (speed/kernels.py's varlen backends)."""
    if ctx.packed is not None:  # k, v (N, heads, d); q (N, heads, d), or the sparse last layer's (B, P, ...)
        queries = None if ctx.rows is None else Packed.dense(q.shape[0], q.shape[1], q.device)
        out = varlen_attention(q.reshape(-1, *q.shape[-2:]), k, v, ctx.packed, dropout_p, ctx.causal,
                               ctx.speed.attention, ctx.speed.fast_kernels, queries)  # (N | B x P, heads, d)
        return out.view(q.shape)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T|P, d)
    if ctx.speed.fast_kernels:
        out = kernels.attention(q, k, v, ctx.mask, dropout_p, ctx.is_causal)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask, dropout_p=dropout_p,
                                             is_causal=ctx.is_causal)
    return out.transpose(1, 2)  # (B, T|P, heads, d)


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
        else:  # the sparse last layer: the query projection at its P rows only, keys and values at all T
            H = x.shape[-1]
            (w_q, w_kv), (b_q, b_kv) = (t.split([H, 2 * H]) for t in (self.qkv.weight, self.qkv.bias))
            q = F.linear(ctx.select(x), w_q, b_q).unflatten(-1, heads)  # (B, P, heads, head_dim)
            k, v = F.linear(x, w_kv, b_kv).unflatten(-1, (2, *heads)).unbind(-3)  # 2 x (..., heads, head_dim)
        dropout_p = self.attention_dropout if self.training else 0.0
        return attend(q, k, v, ctx, dropout_p).flatten(-2)  # (..., H)


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

    def forward(self, x: Tensor, ctx: AttentionContext, output_hidden_states: bool = False,
                output_positions: Tensor | None = None) -> EncoderOutput:
        """``output_positions`` (B, P): the sparse last layer, whose queries, feed-forward and LayerNorms run
        at those P positions only: the output is then (B, P, H)."""
        hidden_states = [ctx.pad(x)] if output_hidden_states else None
        for i, layer in enumerate(self.layer):
            if output_positions is not None and i == len(self.layer) - 1:
                x, ctx = ctx.sparse(x, output_positions)
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


def attention_mask_for_sdpa(attention_mask: Tensor | None, causal: bool, seq_len: int,
                            positions: Tensor | None = None) -> Tensor | None:
    """Padding mask (B, T) of 1 = real, 0 = pad -> boolean SDPA mask (B, 1, 1|T, T), True = may attend;
    with query ``positions`` (B, P) (the sparse last layer), (B, 1, 1|P, T).

    None when nothing needs masking, so SDPA can take its fastest kernel (and apply the causal mask of
    the left-to-right ablation itself, through ``is_causal``, when every position is a query)."""
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and (not causal or positions is None):
        return None
    mask = attention_mask.bool()[:, None, None, :] if padded else None  # (B, 1, 1, T)
    if causal:
        keys = torch.arange(seq_len, device=(attention_mask if padded else positions).device)
        queries = keys[:, None] if positions is None else positions[:, None, :, None]  # (T, 1) | (B, 1, P, 1)
        seen = keys <= queries  # (T, T) | (B, 1, P, T): the left context and the query itself
        mask = seen if mask is None else mask & seen
    return mask


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
        if sequence_ids is not None and output_positions is not None:
            raise ValueError("packed rows (sequence_ids) have no sparse last layer")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        ctx = self.context(attention_mask, sequence_ids, input_ids.shape[1])
        if ctx.packed is not None:
            x = ctx.packed.unpad(x)  # (N, H): only the real tokens from here to the head
        return self.encoder(x, ctx, output_hidden_states, output_positions)

    def context(self, attention_mask: Tensor | None, sequence_ids: Tensor | None,
                seq_len: int) -> AttentionContext:
        """Padded rows and their SDPA mask (padding, the ablation's future, the other instances of packed
        rows), or with speed.unpad the real tokens and their sequences (a row, or a packed instance, each)."""
        ctx = AttentionContext(self.speed, self.config.causal, attention_mask)
        if self.speed.unpad and sequence_ids is not None:
            return replace(ctx, packed=Packed.from_sequence_ids(sequence_ids))
        if self.speed.unpad and attention_mask is not None and not bool(attention_mask.all()):
            return replace(ctx, packed=Packed.from_mask(attention_mask))
        if sequence_ids is not None:
            return replace(ctx, mask=block_diagonal_mask(sequence_ids, self.config.causal))
        return replace(ctx, mask=attention_mask_for_sdpa(attention_mask, self.config.causal, seq_len))


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
        if masked_positions is not None and self.speed.pack and not output_hidden_states:
            # several short instances per row (speed/packing.py), read back at each one's [CLS] and positions
            p = pack_rows(input_ids, token_type_ids, attention_mask)
            out = self.bert(p.input_ids, p.token_type_ids, p.attention_mask, sequence_ids=p.sequence_ids,
                            position_ids=p.position_ids)
            seq, predicted = read_back(p, out.last_hidden_state, masked_positions)  # (B, 1, H), (B, P, H)
        elif masked_positions is not None and self.speed.fast_kernels:
            # the sparse last layer: only [CLS] and the predicted positions leave it, (B, 1 + P, H)
            positions = torch.cat([torch.zeros_like(masked_positions[:, :1]), masked_positions], dim=1)
            out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, positions)
            seq, predicted = out.last_hidden_state, out.last_hidden_state[:, 1:]
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
            seq = predicted = out.last_hidden_state  # (B, T, H)
            if masked_positions is not None:
                index = masked_positions.unsqueeze(-1).expand(-1, -1, seq.shape[-1])  # (B, P, H)
                predicted = seq.gather(1, index)  # (B, P, H)
        return self.heads(predicted, seq, prediction_mask, out.hidden_states, mlm_targets)

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
