"""Speed options change how fast a step runs, never what it computes: the fast
kernels, unpadding (varlen attention, packed rows) and activation checkpointing give the same loss and
gradients as model.py's plain padded pass, and they run model.py's own layers, so an edit there reaches every
configuration; the MFU formula counts what the paper's encoder does."""

import pytest
import torch
import torch.nn.functional as F

from bert_repro.flops import encoder_parameters, training_flops
from bert_repro.heads import SequenceClassifier
from bert_repro.model import BertConfig, BertForPreTraining, BertModel, Dropout, Layer, count_parameters
from bert_repro.speed import SpeedOptions, layout
from bert_repro.speed import loss as speed_loss


def _batch(config: BertConfig, B: int = 4, T: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 7, T - 13, 5])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g) * mask
    types = (torch.arange(T)[None] >= lengths[:, None] // 2).long() * mask
    positions = torch.stack([1 + torch.randperm(int(n) - 1, generator=g)[:3].sort().values for n in lengths])
    return ids, types, mask, positions


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _predictions(ids, mask, positions, ltr: bool):
    """The positions to predict, which are real, and their targets (N,): PretrainModule's choice."""
    if ltr:
        B, T = ids.shape
        positions, real = torch.arange(T - 1).expand(B, -1), mask[:, 1:].bool()
        return positions, real, ids[:, 1:][real]
    real = torch.ones_like(positions, dtype=torch.bool)
    return positions, real, ids.gather(1, positions)[real]


def _pretrain_loss(model, ids, types, mask, positions, ltr: bool):
    positions, real, targets = _predictions(ids, mask, positions, ltr)
    out = model(ids, types, mask, masked_positions=positions, prediction_mask=real)
    loss = F.cross_entropy(out.mlm_logits, targets)
    if out.nsp_logits is not None:
        loss = loss + F.cross_entropy(out.nsp_logits, torch.tensor([0, 1, 1, 0]))
    return loss


def _fast(model, **options):
    """``model``'s weights in the same model built with these speed options (as the task modules build it)."""
    speed = SpeedOptions(**options)
    if isinstance(model, BertForPreTraining):
        fast = BertForPreTraining(model.config, nsp=model.nsp is not None, speed=speed)
    elif isinstance(model, SequenceClassifier):
        fast = SequenceClassifier(model.bert.config, model.classifier.out_features, speed=speed)
    else:
        fast = BertModel(model.config, speed)
    fast.load_state_dict(model.state_dict())
    return fast.train(model.training)


OPTIONS = {"kernels": dict(fast_kernels=True), "unpad": dict(unpad=True),
           "checkpointing": dict(activation_checkpointing=True),
           "all": dict(fast_kernels=True, unpad=True, activation_checkpointing=True),
           "all-nested": dict(fast_kernels=True, unpad=True, attention="nested"),
           "pack": dict(pack=True), "pack+unpad": dict(pack=True, unpad=True, fast_kernels=True)}
# what the first feed-forward sees: the real tokens only (N, H) when unpadded; with packing, the batch's
# rows of 24, 17, 11 and 5 real tokens fill 3 rows of 24 (24 | 17 + 5 | 11)
FIRST_ROWS = {"unpad": (57, 32), "all": (57, 32), "all-nested": (57, 32), "pack+unpad": (57, 32),
              "pack": (3, 24, 32)}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("ltr", [False, True])
def test_pretraining_loss_and_gradients_unchanged(option, ltr):
    if option == "all-nested" and ltr:
        pytest.skip("torch 2.13's nested-jagged SDPA has no CPU kernel for is_causal (no viable backend)")
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=3, num_heads=4, causal=ltr,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertForPreTraining(config, nsp=not ltr).train()
    fast = _fast(model, **OPTIONS[option])
    assert fast.state_dict().keys() == model.state_dict().keys()
    batch = _batch(config)
    assert not bool(batch[2].all())  # padded: unpadding has something to remove
    reference = _pretrain_loss(model, *batch, ltr)
    reference.backward()
    expected = _grads(model)
    rows = []  # what the first feed-forward sees: the real tokens only (N, H) when unpadded
    ffn = fast.bert.encoder.layer[0].intermediate
    hook = ffn.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))
    last = []  # what the last layer's keys and values are computed on
    fast.bert.encoder.layer[-1].register_forward_hook(lambda m, i, o: last.append(i[0].shape))
    loss = _pretrain_loss(fast, *batch, ltr)
    loss.backward()
    hook.remove()
    assert rows[0] == FIRST_ROWS.get(option, (4, 24, 32))
    # unpadded up to the head, the sparse last layer included; the LTR one (causal) pads its keys again
    assert last[0] == ((4, 24, 32) if ltr and option == "all" else rows[0])
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    got = _grads(fast)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("option", ["kernels", "pack+unpad"])
@pytest.mark.parametrize("ltr", [False, True])
def test_the_fused_decoder_and_loss_equal_the_logits_path(option, ltr, monkeypatch):
    """Given the targets, the speed path returns the MLM loss and hits (speed/loss.py) in place of the logits:
    equal to F.cross_entropy and the argmax over model.py's logits, gradients included, over chunks of 7
    predictions and a shorter last one."""
    monkeypatch.setattr(speed_loss, "CHUNK_ELEMENTS", 300 * 7)
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, causal=ltr,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertForPreTraining(config, nsp=not ltr).train()
    fast = _fast(model, **OPTIONS[option])
    ids, types, mask, positions = _batch(config)
    positions, real, targets = _predictions(ids, mask, positions, ltr)
    assert len(targets) % 7  # a ragged last chunk
    out = model(ids, types, mask, masked_positions=positions, prediction_mask=real)
    reference = F.cross_entropy(out.mlm_logits, targets)
    reference.backward()
    expected, hits = _grads(model), int((out.mlm_logits.argmax(-1) == targets).sum())
    fused = fast(ids, types, mask, masked_positions=positions, prediction_mask=real, mlm_targets=targets)
    assert fused.mlm_logits is None and int(fused.mlm_correct) == hits
    fused.mlm_loss.backward()
    torch.testing.assert_close(fused.mlm_loss, reference, atol=1e-6, rtol=1e-6)
    got = _grads(fast)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():  # evaluation keeps the logits
        again = fast(ids, types, mask, masked_positions=positions, prediction_mask=real, mlm_targets=targets)
    assert again.mlm_loss is None and again.mlm_logits.shape == (len(targets), 300)


@pytest.mark.parametrize("ltr", [False, True])
def test_the_fused_decoder_and_loss_follow_bf16_autocast_as_the_logits_path_does(ltr, monkeypatch):
    """Under bf16 autocast (bf16-mixed) the fused path multiplies in bf16 as F.linear would and keeps the
    softmax in fp32 as the logits path's .float(): the same loss, hits and gradients up to bf16 rounding."""
    monkeypatch.setattr(speed_loss, "CHUNK_ELEMENTS", 300 * 7)
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, causal=ltr,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertForPreTraining(config, nsp=not ltr).train()
    fast = _fast(model, **OPTIONS["kernels"])
    ids, types, mask, positions = _batch(config)
    positions, real, targets = _predictions(ids, mask, positions, ltr)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast(ids, types, mask, masked_positions=positions, prediction_mask=real)
        assert out.mlm_logits.dtype == torch.bfloat16
        reference = F.cross_entropy(out.mlm_logits.float(), targets)
    reference.backward()
    expected, hits = _grads(fast), int((out.mlm_logits.argmax(-1) == targets).sum())
    fast.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = fast(ids, types, mask, masked_positions=positions, prediction_mask=real, mlm_targets=targets)
    assert fused.mlm_logits is None and fused.mlm_loss.dtype == torch.float32
    assert abs(int(fused.mlm_correct) - hits) <= 1  # a bf16 near-tie may fall either way
    fused.mlm_loss.backward()
    torch.testing.assert_close(fused.mlm_loss, reference, atol=1e-3, rtol=1e-3)
    got = _grads(fast)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=2e-3, rtol=5e-2, msg=name)

@pytest.mark.parametrize("ltr", [False, True])
def test_pretrain_module_logs_the_same_loss_and_accuracy_on_the_fused_path(ltr):
    from bert_repro.tasks.pretrain import PretrainModule

    model = dict(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, causal=ltr, hidden_dropout=0.0,
                 attention_dropout=0.0)
    optim = dict(lr=1e-3, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, warmup_steps=2, warmup_ratio=None)
    config = BertConfig(**model)
    ids, types, mask, positions = _batch(config)
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
             "masked_lm_positions": positions,
             "masked_lm_ids": ids.gather(1, positions), "masked_lm_weights": torch.ones(positions.shape),
             "next_sentence_labels": torch.tensor([0, 1, 1, 0])}
    results = []
    for speed in (None, {"fast_kernels": True}):
        torch.manual_seed(0)
        module = PretrainModule(model=model, optim=optim, nsp=not ltr, ltr=ltr, speed=speed)
        module.log = module.log_dict = lambda *a, **k: None
        loss = module._step(batch, "train")
        results.append((loss.item(), module.train_mlm_acc.compute().item()))
    assert results[1] == pytest.approx(results[0], rel=1e-6)


def test_speed_options_add_no_module_class_and_no_parameter():
    """One encoder: a model built with every speed option is made of the same model.py classes, with the same
    parameter names, as the plain one; each layer is still called as a module (its hooks fire), so FSDP's
    per-Layer units and activation checkpointing wrap it."""
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4)
    plain = BertForPreTraining(config)
    fast = BertForPreTraining(config, speed=SpeedOptions(**OPTIONS["all"], pack=True))
    assert [type(m) for m in fast.modules()] == [type(m) for m in plain.modules()]
    assert fast.state_dict().keys() == plain.state_dict().keys()
    calls = []
    fast.bert.encoder.layer[0].register_forward_hook(lambda *_: calls.append(1))
    fast.bert(torch.randint(5, 300, (2, 8)), attention_mask=torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))
    assert calls == [1] and isinstance(fast.bert.encoder.layer[0], Layer)
    with pytest.raises(ValueError, match="speed.attention=cuda: expected one of auto"):
        SpeedOptions(attention="cuda")


def _pre_ln(self, x, ctx):
    """The pre-LN block (Xiong et al., 2020) an engineer might try: LayerNorm before each sub-layer."""
    a = self.attention
    x = ctx.select(x) + a.dropout(a.dense(a(a.LayerNorm(x), ctx)))
    return x + self.dropout(self.output(F.gelu(self.intermediate(self.LayerNorm(x)))))


_attend = layout.attend
EDITS = {"pre-LN Layer.forward": (Layer, "forward", _pre_ln),
         "attend at temperature 1/2": (layout, "attend", lambda q, *rest: _attend(2 * q, *rest))}
# every speed configuration, each CPU attention backend of the unpadded path among them
EVERY_PATH = {"plain": {}, **OPTIONS, "unpad-padded": dict(unpad=True, attention="padded"),
              "unpad-nested": dict(unpad=True, attention="nested"),
              "pack+checkpointing": dict(pack=True, activation_checkpointing=True)}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("option", list(EVERY_PATH))
@pytest.mark.parametrize("ltr", [False, True])
def test_an_edit_to_model_py_reaches_every_speed_configuration(edit, option, ltr, monkeypatch):
    """The speed options run model.py's layers, not copies of them. One function of model.py
    patched (the block's residual/LayerNorm order, or the attention), every configuration computes the edited
    model: its loss moves off the unedited one, to the plain path's edited loss, gradients included."""
    if "nested" in option and ltr:
        pytest.skip("torch 2.13's nested-jagged SDPA has no CPU kernel for is_causal (no viable backend)")
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=3, num_heads=4, causal=ltr,
                        hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.2)
    torch.manual_seed(0)
    model = BertForPreTraining(config, nsp=not ltr).train()
    fast = _fast(model, **EVERY_PATH[option])
    batch = _batch(config)
    before = _pretrain_loss(fast, *batch, ltr).detach()
    monkeypatch.setattr(*EDITS[edit])
    reference = _pretrain_loss(model, *batch, ltr)
    reference.backward()
    loss = _pretrain_loss(fast, *batch, ltr)
    loss.backward()
    assert (loss.detach() - before).abs() > 1e-3  # the edit took effect on this path (100x the tolerance)
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)  # and it is the plain path's edit
    expected, got = _grads(model), _grads(fast)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("backend", ["nested", "padded"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_on_packed_tokens_matches_the_padded_model(backend, causal):
    """Real unpadding: nothing padded from the embeddings to the head, attention per sequence with
    torch's nested-jagged SDPA (its CPU math kernel; the CUDA path uses the same call) or the padded
    reference; the classifier's loss and every gradient are the padded model's."""
    if backend == "nested" and causal:
        pytest.skip("torch 2.13's nested-jagged SDPA has no CPU kernel for is_causal (no viable backend)")
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, causal=causal,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = SequenceClassifier(config, num_labels=3).train()
    fast = _fast(model, unpad=True, attention=backend)
    ids, types, mask, _ = _batch(config)
    labels = torch.tensor([0, 1, 2, 1])
    losses, grads = [], []
    for m in (model, fast):
        loss = F.cross_entropy(m(ids, types, mask), labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append(_grads(m))
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("unpad", [False, True])
def test_packed_rows_equal_one_instance_per_row(unpad):
    """Sequence packing: two short instances in one row (block-diagonal attention, positions restarting
    at each instance) give each instance the hidden states it has alone in its own row: varlen attention
    per instance (unpad), or a dense block-diagonal mask."""
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    bert = BertModel(config).eval()
    fast = _fast(bert, unpad=unpad, pack=True)
    ids, types, mask, _ = _batch(config)  # lengths 24, 17, 11, 5: pack rows 2 and 3 into one
    a, b = int(mask[2].sum()), int(mask[3].sum())
    row = lambda x: torch.cat([x[2, :a], x[3, :b], x.new_zeros(24 - a - b)])[None]  # noqa: E731
    packed_ids, packed_types = row(ids), row(types)
    sequence_ids = torch.tensor([[1] * a + [2] * b + [0] * (24 - a - b)])  # which instance; 0 = padding
    pad = torch.zeros(24 - a - b, dtype=torch.long)
    position_ids = torch.cat([torch.arange(a), torch.arange(b), pad])[None]  # restarting per instance
    with torch.no_grad():
        alone = bert(ids, types, mask).last_hidden_state
        packed = fast(packed_ids, packed_types, (sequence_ids > 0).long(), sequence_ids=sequence_ids,
                      position_ids=position_ids).last_hidden_state
        naive = bert(packed_ids, packed_types, (sequence_ids > 0).long()).last_hidden_state
    torch.testing.assert_close(packed[0, :a], alone[2, :a], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[0, a:a + b], alone[3, :b], atol=1e-5, rtol=1e-5)
    assert (naive[0, a:a + b] - alone[3, :b]).abs().max() > 1e-3  # without the block diagonal they differ


def test_first_fit_packs_longest_first_into_the_first_row_with_room():
    from bert_repro.speed.packing import first_fit, pack_rows

    assert first_fit([24, 17, 11, 5], 24) == ([0, 1, 2, 1], [0, 0, 0, 17])
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [3, 0, 0, 0]])
    p = pack_rows(ids, torch.zeros_like(ids), (ids > 0).long())
    assert p.input_ids.tolist() == [[5, 6, 7, 3], [8, 9, 0, 0]] and p.start.tolist() == [0, 4, 3]
    assert p.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]
    assert p.sequence_ids.tolist() == [[1, 1, 1, 3], [2, 2, 0, 0]]


def test_unpadded_sequence_and_hidden_states_match_at_real_tokens():
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    bert = BertModel(config).eval()
    fast = _fast(bert, unpad=True, fast_kernels=True)
    ids, types, mask, _ = _batch(config)
    with torch.no_grad():
        reference = bert(ids, types, mask, output_hidden_states=True)
        out = fast(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], reference.last_hidden_state[real], atol=1e-5,
                               rtol=1e-5)
    for got, expected in zip(out.hidden_states, reference.hidden_states, strict=True):
        torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_unpadding_with_dropout_keeps_classifier_training_statistics():
    """With dropout on, the two paths draw different masks; the loss is still a proper, finite loss of
    the same magnitude and the classifier's gradient flows (no position silently dropped)."""
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    speed = SpeedOptions(unpad=True, fast_kernels=True)
    model = SequenceClassifier(config, num_labels=3, speed=speed).train()
    ids, types, mask, _ = _batch(config)
    loss = F.cross_entropy(model(ids, types, mask), torch.tensor([0, 1, 2, 1]))
    loss.backward()
    assert torch.isfinite(loss) and 0.5 < float(loss.detach()) < 2.5
    assert model.bert.encoder.layer[0].attention.qkv.weight.grad.abs().sum() > 0


def _finetuning_module(family: str, speed: dict):
    """One fine-tuning task module (dropout off, so both paths compute the same function) and a padded
    training batch of it: the lengths 24, 17, 11 and 5 of _batch (choice: one example of four candidates)."""
    from bert_repro.tasks.choice import MultipleChoiceModule
    from bert_repro.tasks.classification import SequenceClassificationModule
    from bert_repro.tasks.span import SpanExtractionModule
    from bert_repro.tasks.tagging import TokenTaggingModule

    model = dict(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, hidden_dropout=0.0,
                 attention_dropout=0.0)
    optim = dict(lr=1e-4, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01)
    ids, types, mask, _ = _batch(BertConfig(**model))
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    torch.manual_seed(0)
    if family == "classification":
        return SequenceClassificationModule(model, optim, task="mrpc", num_labels=2, speed=speed), \
            batch | {"labels": torch.tensor([0, 1, 1, 0])}
    if family == "tagging":
        labels = torch.randint(0, 9, ids.shape, generator=torch.Generator().manual_seed(1))
        labels = labels.masked_fill(mask == 0, -100)  # padding is never scored
        return TokenTaggingModule(model, optim, speed=speed), batch | {"labels": labels}
    if family == "span":
        return SpanExtractionModule(model, optim, version=1, speed=speed), \
            batch | {"start_positions": torch.tensor([3, 9, 2, 0]),
                     "end_positions": torch.tensor([5, 12, 2, 0])}
    choices = {k: v[None] for k, v in batch.items()}  # (1, 4, T): the four candidates of one example
    return MultipleChoiceModule(model, optim, speed=speed), choices | {"labels": torch.tensor([2])}


@pytest.mark.parametrize("family", ["classification", "tagging", "span", "choice"])
@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")  # a training step outside a Trainer
def test_finetuning_modules_run_unpadded_with_the_padded_loss_and_gradients(family):
    """speed.unpad=true reaches every fine-tuning task module, not only pre-training: the layers see the
    57 real tokens of the padded batch (N, H), and each module's training loss and every gradient are
    those of model.py's padded path on the same weights."""
    module, batch = _finetuning_module(family, {})
    fast, _ = _finetuning_module(family, {"unpad": True, "fast_kernels": True})  # run.py's speed.unpad=true
    fast.load_state_dict(module.state_dict())
    assert fast.model.bert.speed.unpad and module.model.bert.speed == SpeedOptions()
    rows = []
    ffn = fast.model.bert.encoder.layer[0].intermediate
    ffn.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))
    losses, grads = [], []
    for m in (module, fast):
        loss = m.training_step(batch, 0)
        loss.backward()
        losses.append(loss.detach())
        grads.append(_grads(m.model))
    assert rows == [(57, 32)]
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    assert grads[1].keys() == grads[0].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_task_modules_take_speed_options_as_hyper_parameters():
    from bert_repro.tasks.pretrain import PretrainModule

    model = dict(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4)
    optim = dict(lr=1e-4, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01)
    module = PretrainModule(model, optim, speed={"unpad": True, "activation_checkpointing": True})
    assert module.hparams.speed == {"unpad": True, "activation_checkpointing": True}
    assert module.model.bert.speed.unpad and module.model.bert.encoder.checkpointing
    assert PretrainModule(model, optim).model.bert.speed == SpeedOptions()  # no options: the plain path


@pytest.mark.slow
def test_encoder_parameters_and_flops_formula():
    base = BertConfig()
    bert = BertModel(base)
    # non-embedding parameters less the embedding LayerNorm and the pooler: the layers themselves
    H = base.hidden_size
    assert encoder_parameters(base) == count_parameters(bert, non_embedding=True) - 2 * H - (H * H + H)
    assert encoder_parameters(base) == 85_054_464
    # 128 real tokens, 20 predictions: 6N per token + attention over 128 keys + the head at 20 positions
    flops = training_flops(base, tokens=128, seq_len=128, predictions=20)
    expected = 128 * (6 * 85_054_464 + 12 * 12 * 128 * 768) + 20 * 6 * (768 * 768 + 768 * 30522)
    assert flops == expected
    assert 5.0e-4 < flops / 128 / 1e12 < 6.0e-4  # ~0.55 GFLOP per token, the usual BERT-base figure


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_cpu_attention_with_dropout_is_sdpa_with_an_independent_keep_mask(causal, masked):
    """On CPU, attention dropout runs SDPA's math with model.dropout's mask: softmax(q k^T / sqrt(d)) with
    the boolean mask (or the causal one), each probability kept with 1 - p and scaled, then times v."""
    from bert_repro.speed.kernels import attention, dropout_mask

    g = torch.Generator().manual_seed(1)
    B, heads, T, d, p = 2, 3, 6, 4, 0.3
    q, k, v = (torch.randn(B, heads, T, d, generator=g) for _ in range(3))
    mask = None
    if masked:  # the second row is padded after 4 keys
        mask = (torch.arange(T)[None, :] < torch.tensor([T, 4])[:, None])[:, None, None, :]
        if causal:
            mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
    is_causal = causal and mask is None
    torch.manual_seed(7)
    got = attention(q, k, v, mask, p, is_causal)
    torch.manual_seed(7)
    multiplier = dropout_mask(torch.empty(B, heads, T, T), p)  # the draw attention makes
    keep, scale = multiplier != 0, float(multiplier.max())
    assert scale == pytest.approx(1 / (1 - p), abs=1e-4)
    identity = torch.eye(T).expand(B, heads, T, T)  # SDPA with v = I returns the attention probabilities
    probs = F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, is_causal=is_causal)
    torch.testing.assert_close(got, (probs * keep * scale) @ v, atol=1e-5, rtol=1e-5)
    assert 0 < int((~keep).sum()) < keep.numel()  # both kept and dropped probabilities were exercised
    torch.testing.assert_close(attention(q, k, v, mask, 0.0, is_causal),  # no dropout: SDPA itself
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal))
    half = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, p, is_causal)  # bf16 model, no autocast
    assert half.dtype == torch.bfloat16 and torch.isfinite(half.float()).all()


def test_dropout_keeps_one_minus_p_scaled_and_is_identity_in_eval():
    layer = Dropout(0.1, cpu_kernel=True)
    x = torch.ones(400_001)  # not a multiple of the four draws per 64-bit word
    torch.manual_seed(0)
    y = layer.train()(x)
    kept = y != 0
    assert abs(float(kept.float().mean()) - 0.9) < 0.003  # 400k Bernoulli(0.9): sd 0.0005
    for lane in range(4):  # each 16-bit lane of the 64-bit words is its own uniform draw
        assert abs(float(kept[lane::4].float().mean()) - 0.9) < 0.005
    assert float(y.mean()) == pytest.approx(1.0, abs=0.005)  # the expectation is kept
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 65536 / (65536 - 6554)))  # p' = 6554 / 65536
    torch.manual_seed(0)
    assert torch.equal(layer(x), y)  # the global seed decides the draw
    assert not torch.equal(layer(x), y)
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(Dropout(0.0, cpu_kernel=True).train()(x), x)
    assert layer.train()(x.bfloat16()).dtype == torch.bfloat16  # the input's dtype, as nn.Dropout


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_dropout_mask_rate_scale_and_dtype(p):
    from bert_repro.speed.kernels import dropout_mask

    torch.manual_seed(1)
    mask = dropout_mask(torch.empty(200, 1000), p)
    assert mask.shape == (200, 1000) and mask.dtype == torch.float32
    keep = mask != 0
    assert abs(float(keep.float().mean()) - (1 - p)) < 0.005
    assert set(mask.unique().tolist()) == {0.0, float(mask.max())}
    assert float(mask.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(mask.max()) * (1 - p) == pytest.approx(1.0, abs=1e-4)
    half = dropout_mask(torch.empty(10_000, dtype=torch.bfloat16), p)
    assert half.dtype == torch.float32 and float(half.max()) == float(mask.max())  # bf16 can't hold the scale
    assert float(dropout_mask(torch.empty(5), 0.999999).max()) < float("inf")  # p rounds to 1: still a level


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one_on_cpu():
    """trainer.compile on CPU: Inductor compiles the whole step, dropout included (its draws from ATen's
    generator, ``fallback_random``, in the eager order); the loss and gradients are the eager ones up to float
    tolerance. Both run the native dropout: compiled, the CPU mask kernel steps aside (test_compile.py)."""
    import torch._inductor.config

    from bert_repro.speed import compile_model

    # one layer: a second is the same code, and its C++ kernels (most of the test's time) add nothing to prove
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4)
    torch.manual_seed(0)
    eager = BertForPreTraining(config).train()
    compiled = BertForPreTraining(config).train()
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled, "cpu")
    batch = _batch(config)
    results = []
    # kernels compiled in this process: a pool of compile workers costs a torch import each, on cores the
    # other test worker is using
    with torch._inductor.config.patch(compile_threads=1):
        for model in (eager, compiled):
            torch.manual_seed(3)
            loss = _pretrain_loss(model, *batch, ltr=False)
            loss.backward()
            results.append((loss.detach(), _grads(model)))
    (loss, grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, loss, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], atol=1e-4, rtol=1e-3, msg=name)


def test_speed_options_are_declared_once():
    """schema.SpeedOptions is the speed: node's schema and defaults, what the model reads and what run.py
    hands over: trainer/ sets only what differs, and a wrong value is named with its key wherever it comes
    from."""
    from dataclasses import asdict, fields

    import yaml
    from hydra import compose, initialize_config_dir

    from bert_repro import speed
    from bert_repro.config import SpeedOptions

    from .conftest import CONF

    assert speed.SpeedOptions is SpeedOptions
    defaults = asdict(SpeedOptions())
    set_here = yaml.safe_load((CONF / "trainer" / "cpu.yaml").read_text())["speed"]
    assert set_here and all(defaults[k] != v for k, v in set_here.items()), set_here
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        node = compose("train", overrides=["trainer=gpu"]).speed
    assert set(node) == {f.name for f in fields(SpeedOptions)}
    with pytest.raises(ValueError, match=r"speed.attention=bogus: expected one of auto, flash, nested"):
        SpeedOptions(attention="bogus")


def test_unpadding_on_a_gpu_without_torchs_varlen_attention_warns_once(monkeypatch):
    """Where ``auto`` falls back to nested-jagged attention on a GPU (a torch without varlen_attn), the run is
    told once, with the two ways out; with varlen_attn it takes torch's flash kernel."""
    import warnings
    from types import SimpleNamespace

    from bert_repro.speed import kernels

    gpu = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)  # all varlen_backend reads
    monkeypatch.setattr(kernels, "varlen_attn", lambda *args, **kwargs: None)
    assert kernels.varlen_backend("auto", gpu, causal=False) == "flash"
    monkeypatch.setattr(kernels, "varlen_attn", None)
    kernels._warn_nested.cache_clear()
    with pytest.warns(UserWarning, match="use torch >= 2.10 with bf16, or set speed.unpad=false"):
        assert kernels.varlen_backend("auto", gpu, causal=False) == "nested"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.varlen_backend("auto", gpu, causal=False) == "nested"
        cpu = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
        assert kernels.varlen_backend("auto", cpu, causal=False) == "padded"
    kernels._warn_nested.cache_clear()
