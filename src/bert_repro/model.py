"""The BERT encoder (Devlin et al., §3.1) in one readable file.

Post-LayerNorm Transformer encoder with exact GELU, learned position embeddings and segment
embeddings, attention through ``torch.nn.functional.scaled_dot_product_attention``. The module
tree follows the Hugging Face / Google parameter vocabulary (``embeddings.word_embeddings``,
``encoder.layer.N.attention.LayerNorm`` ...) with a few shorter names (``attention.dense`` for
``attention.output.dense``, ``intermediate`` for ``intermediate.dense`` ...) and query, key and value
in one fused ``qkv`` projection (one GEMM instead of three); ``convert.py``'s table maps between the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
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


DROPOUT_LEVELS = 1 << 16  # the resolution of p in dropout_mask: a 16-bit uniform integer per element


def dropout_mask(like: Tensor, p: float) -> Tensor:
    """Dropout's multiplier for a tensor shaped like ``like`` (and of its dtype): independent draws of
    1 / (1 - p') with probability 1 - p' and 0 otherwise, p' = round(p * 65536) / 65536 (|p' - p| <= 7.6e-6),
    so the expectation is exactly 1. Each element is one 16-bit lane of a uniform 64-bit word (``random_`` over
    the full int64 range): on CPU, where ATen draws random numbers serially, that is 2.6x cheaper per element
    than ``torch.rand`` and 5x cheaper than ``bernoulli_`` (1.57M elements: 2.0 vs 5.2 vs 10 ms), and random
    numbers were the costliest part of a CPU training step outside the GEMMs. The mask is made in the input's
    dtype, scale included, so applying it (and its backward) is one multiplication, no bool conversion; in
    float32 for a half-precision input, whose dtype cannot hold the scale exactly (bf16: 1.109 for 1.111)."""
    n, drop = like.numel(), min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device).random_(-(1 << 63), None)
    lanes = words.view(torch.int16)[:n].view(like.shape)  # uniform on [-32768, 32767]
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    scale = torch.tensor(DROPOUT_LEVELS / (DROPOUT_LEVELS - drop), dtype=dtype, device=like.device)
    return torch.where(lanes >= drop - (DROPOUT_LEVELS >> 1), scale, scale.new_zeros(()))


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of ``x`` with ``dropout_mask``: nn.Dropout's distribution, p to 1/65536, in
    ``x``'s dtype (a half-precision result is rounded once, from the float32 product, as the native kernel's)."""
    return (x * dropout_mask(x, p)).to(x.dtype)


class Dropout(nn.Dropout):
    """nn.Dropout (same module, same ``p``), drawing its mask with ``dropout`` on CPU; on accelerators the
    fused native kernel is the faster one."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and 0.0 < self.p < 1.0 and x.device.type == "cpu":
            return dropout(x, self.p)
        return super().forward(x)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool) -> Tensor:
    """``F.scaled_dot_product_attention``. With attention dropout on CPU, where SDPA's fused kernels take no
    dropout and it falls back to its math path, the same math runs here with ``dropout``'s cheaper mask:
    softmax(q k^T / sqrt(d), masked) -> dropout -> x v. ``mask``: boolean, True = may attend."""
    if dropout_p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, heads, T|P, T)
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))  # in place: the product's backward needs q and k, not it
    return dropout(scores.softmax(-1), dropout_p) @ v


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
        self.dropout = Dropout(config.hidden_dropout)
        self.max_position = config.max_position

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.max_position:
            raise ValueError(f"sequence length {seq_len} exceeds max_position {self.max_position}")
        positions = torch.arange(seq_len, device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(positions))  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection, followed by the residual + LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)
        self.attention_dropout = config.attention_dropout
        self.causal = config.causal

    def forward(self, x: Tensor, mask: Tensor | None, positions: Tensor | None = None,
                unpadded: Unpadded | None = None) -> Tensor:
        """``positions`` (B, P): compute outputs only there (queries at P positions, keys and values
        everywhere); the result is then (B, P, H) and exactly the rows a full pass would give.
        ``unpadded``: ``x`` holds only the real tokens (N, H); the projections run on them, and only the
        attention itself sees them in their padded (B, T) places."""
        if unpadded is not None:
            qkv = unpadded.pad(self.qkv(x))  # (B, T, 3H), zeros at the padding
            B, T, _ = qkv.shape
            q, k, v = qkv.view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            context = attention(q, k, v, mask, self.attention_dropout if self.training else 0.0, False)
            context = unpadded.unpad(context.transpose(1, 2).reshape(B, T, -1))  # (N, H)
            return self.LayerNorm(x + self.dropout(self.dense(context)))
        B, T, H = x.shape
        if positions is None:
            qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, heads, T, head_dim)
            residual = x
        else:
            residual = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, H))  # (B, P, H)
            (w_q, w_kv), (b_q, b_kv) = self.qkv.weight.split([H, 2 * H]), self.qkv.bias.split([H, 2 * H])
            q = F.linear(residual, w_q, b_q).view(B, -1, self.num_heads, self.head_dim).transpose(1, 2)  # (B, heads, P, hd)
            kv = F.linear(x, w_kv, b_kv).view(B, T, 2, self.num_heads, self.head_dim)  # (B, T, 2, heads, head_dim)
            k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, heads, T, head_dim)
        context = attention(q, k, v, mask, self.attention_dropout if self.training else 0.0,
                            self.causal and mask is None)  # (B, heads, T|P, head_dim)
        context = context.transpose(1, 2).reshape(B, -1, H)  # (B, T|P, H)
        return self.LayerNorm(residual + self.dropout(self.dense(context)))  # post-LN (Vaswani et al.)


class Layer(nn.Module):
    """One encoder block: attention sub-layer, then the 4H feed-forward sub-layer, each post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: Tensor, mask: Tensor | None, positions: Tensor | None = None,
                unpadded: Unpadded | None = None) -> Tensor:
        x = self.attention(x, mask, positions, unpadded)  # (B, T|P, H), or (N, H) unpadded
        h = F.gelu(self.intermediate(x))  # exact (erf) GELU: HF's "gelu", as the released checkpoints are run
        return self.LayerNorm(x + self.dropout(self.output(h)))


class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit, to move activations between (B, T, ...) and the
    packed (N, ...) of its N real tokens (MosaicBERT's and NVIDIA's unpadding)."""

    def __init__(self, attention_mask: Tensor):
        self.shape = attention_mask.shape  # (B, T)
        self.index = attention_mask.flatten().nonzero().squeeze(1)  # (N,) positions in the flattened batch

    def unpad(self, x: Tensor) -> Tensor:
        return x.flatten(0, 1).index_select(0, self.index)  # (B, T, ...) -> (N, ...)

    def pad(self, x: Tensor) -> Tensor:
        flat = x.new_zeros(self.shape.numel(), *x.shape[1:]).index_copy(0, self.index, x)
        return flat.view(*self.shape, *x.shape[1:])  # (N, ...) -> (B, T, ...), zeros at the padding


class Encoder(nn.Module):
    """The L layers. Speed options that leave the function unchanged (set by the run from trainer/):
    ``unpad`` runs every projection, feed-forward and LayerNorm on the real tokens only; ``checkpointing``
    recomputes each layer's activations in the backward pass instead of storing them (activation
    checkpointing: memory for compute)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.unpad = False
        self.checkpointing = False

    def _run(self, layer: Layer, *args) -> Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def forward(self, x: Tensor, mask: Tensor | None, output_hidden_states: bool = False,
                last_positions: Tensor | None = None, last_mask: Tensor | None = None,
                attention_mask: Tensor | None = None) -> EncoderOutput:
        """``last_positions`` (B, P): the last layer runs only there (with ``last_mask``), see BertModel.
        ``attention_mask`` (B, T): the padding, which ``unpad`` removes."""
        unpadded = Unpadded(attention_mask) if self.unpad and attention_mask is not None \
            and not bool(attention_mask.all()) else None
        hidden_states = [x] if output_hidden_states else None
        if unpadded is not None:
            x = unpadded.unpad(x)  # (N, H)
        for i, layer in enumerate(self.layer):
            last = last_positions is not None and i == len(self.layer) - 1
            if last:
                if unpadded is not None:  # the sparse last layer reads keys and values in place
                    x, unpadded = unpadded.pad(x), None
                x = self._run(layer, x, last_mask, last_positions)
            else:
                x = self._run(layer, x, mask, None, unpadded)
            if hidden_states is not None:
                hidden_states.append(x if unpadded is None else unpadded.pad(x))
        if unpadded is not None:
            x = unpadded.pad(x)
        return EncoderOutput(last_hidden_state=x, hidden_states=hidden_states)


class Pooler(nn.Module):
    """tanh(W C + b) on the final hidden state of [CLS] (§3.2: C, the aggregate representation)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: Tensor) -> Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))  # (B, H)


def attention_mask_for_sdpa(attention_mask: Tensor | None, causal: bool, seq_len: int,
                            query_positions: Tensor | None = None) -> Tensor | None:
    """Padding mask (B, T) of 1 = real, 0 = pad -> boolean SDPA mask (B, 1, T|P|1, T), True = may attend.

    ``query_positions`` (B, P): the queries sit at these positions (the sparse last layer), which the
    causal mask must know. Returns None when nothing needs masking, so SDPA can take its fastest
    kernel (and apply a square causal mask itself through ``is_causal``).
    """
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and not (causal and query_positions is not None):
        return None
    keys = torch.arange(seq_len, device=(attention_mask if attention_mask is not None else query_positions).device)
    mask = attention_mask.bool()[:, None, None, :] if padded else None  # (B, 1, 1, T)
    if causal:
        queries = keys[:, None] if query_positions is None else query_positions[:, None, :, None]
        left = keys <= queries  # (T, T) or (B, 1, P, T)
        mask = left if mask is None else mask & left
    return mask


class BertModel(nn.Module):
    """Embeddings + encoder + pooler. ``forward`` returns the sequence; ``pooler`` is called by heads that need C."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config.initializer_range)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_hidden_states: bool = False,
        output_positions: Tensor | None = None,
    ) -> EncoderOutput:
        """``output_positions`` (B, P): return the last layer only at these positions, (B, P, H).

        Exact, and cheaper: the last layer's queries, feed-forward and LayerNorms run at P instead of T
        positions (pre-training reads only [CLS] and the ~15% predicted positions there).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        T = input_ids.shape[1]
        mask = attention_mask_for_sdpa(attention_mask, self.config.causal, T)
        last_mask = None
        if output_positions is not None:
            last_mask = attention_mask_for_sdpa(attention_mask, self.config.causal, T, output_positions)
        return self.encoder(x, mask, output_hidden_states, output_positions, last_mask, attention_mask)


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

    def forward(self, hidden: Tensor, decoder_weight: Tensor) -> Tensor:
        """``decoder_weight`` is the word-embedding matrix (V, H): tied, so it is passed, not owned."""
        h = self.LayerNorm(F.gelu(self.dense(hidden)))  # (..., H)
        # W h^T + b, transposed back, rather than h W^T + b: the tied weight's gradient is then a fresh
        # (V, H) product that autograd adds the embedding lookup's gradient into in place, where F.linear's
        # is a transposed view that costs an out-of-place (V, H) sum (base: 40 ms of a 3.3 s CPU step)
        flat = h.reshape(-1, h.shape[-1])  # (N, H)
        logits = torch.addmm(self.bias[:, None], decoder_weight, flat.t()).t()  # (N, V)
        return logits.reshape(*h.shape[:-1], logits.shape[-1])  # (..., V)


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
        """MLM logits at ``masked_positions`` (B, P) when given, else at every position.

        With positions, only they (and [CLS], for NSP) leave the last layer (BertModel's
        ``output_positions``) and meet the vocabulary projection: ~20 of 128 positions are scored at
        V=30,522, not all of them (google-research/bert gathers them too). ``prediction_mask`` (B, P)
        marks the real predictions; the logits are then (N, V) for its N True entries.
        """
        positions = masked_positions
        if positions is not None and self.nsp is not None:
            positions = torch.cat([torch.zeros_like(positions[:, :1]), positions], dim=1)  # (B, 1+P): [CLS] first
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, positions)
        seq = out.last_hidden_state  # (B, T, H), or (B, [1+]P, H) at ([CLS] and) the positions
        predicted = seq[:, 1:] if positions is not None and self.nsp is not None else seq  # (B, P|T, H)
        if prediction_mask is not None:
            predicted = predicted[prediction_mask]  # (N, H)
        mlm_logits = self.mlm(predicted, self.bert.embeddings.word_embeddings.weight)  # (B, P|T, V) or (N, V)
        nsp_logits = self.nsp(self.bert.pooler(seq)) if self.nsp is not None else None
        return PreTrainingOutput(mlm_logits, nsp_logits, seq, out.hidden_states)


@dataclass
class PreTrainingOutput:
    mlm_logits: Tensor  # (B, P, V), (B, T, V), or (N, V) with a prediction mask
    nsp_logits: Tensor | None  # (B, 2)
    last_hidden_state: Tensor  # (B, T, H); with masked_positions only ([CLS] and) those: (B, [1+]P, H)
    hidden_states: list[Tensor] | None = None


def compile_model(model: nn.Module, device_type: str) -> None:
    """``model.compile()`` (Inductor). For CPU runs, Inductor is told to draw random numbers with ATen's
    generator (``fallback_random``) instead of its per-element Philox: on a CPU the latter made dropout the
    costliest kernel of a compiled BERT-base step (bench: MFU 0.80 with it, 0.845 with ATen's)."""
    if device_type == "cpu":
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    model.compile()


def count_parameters(module: nn.Module, non_embedding: bool = False) -> int:
    """Unique parameters (tied weights counted once); ``non_embedding`` drops the embedding tables."""
    params = {id(p): p for p in module.parameters()}
    if non_embedding:
        for m in module.modules():
            if isinstance(m, nn.Embedding):
                params.pop(id(m.weight), None)
    return sum(p.numel() for p in params.values())

