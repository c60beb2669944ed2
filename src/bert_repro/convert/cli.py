"""``python -m bert_repro.convert check|to-hf|push-to-hub``: the parity check against transformers, export to
Hugging Face format of any checkpoint ``load_checkpoint`` reads (a fine-tuned one with its task head, label
names and a model card), into an empty or new folder (``--force`` replaces a non-empty one whole), and the
upload of such a folder to the Hub."""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path

from bert_repro.config import option
from bert_repro.convert.card import push_to_hub, run_results, write_card
from bert_repro.convert.export import export_finetuned, export_hf, finetuned_architecture, fresh_folder
from bert_repro.convert.loaders import build_model, load_checkpoint
from bert_repro.convert.names import ARCHITECTURES, HEADS
from bert_repro.convert.parity import (
    compare_task_with_transformers,
    compare_with_transformers,
    sentence_batch,
)
from bert_repro.convert.safe import CheckpointError, safe_torch_load
from bert_repro.lifecycle.exits import FAULTS
from bert_repro.lifecycle.folder import find_runs
from bert_repro.network import DEFAULT_S, Unreachable, set_deadline


def _check(src: str, tol: float) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("error: `check` compares against the reference implementation: pip install transformers",
              file=sys.stderr)
        return 2
    loaded = load_checkpoint(src)
    module = task_module(Path(src), strict=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(src)
        hf_dir = path if path.is_dir() and (path / "config.json").is_file() else None
        if hf_dir is None:  # ours or TF: transformers reads our export of it
            hf_dir = export_hf(build_model(loaded), tmp, loaded.vocab, loaded.lowercase is not False,
                               loaded.missing_heads)
        rows = compare_with_transformers(loaded, hf_dir)
        if module is not None:  # a fine-tuned model: its head too, where transformers has the class
            try:
                architecture = finetuned_architecture(module)
            except ValueError as err:
                print(f"note: the task head is not compared: {err}")
            else:
                task_dir = export_finetuned(module, Path(tmp) / "task")
                rows += compare_task_with_transformers(module, architecture, task_dir, sentence_batch(loaded))
    c = loaded.config
    print(f"{loaded.source}: L={c.num_layers} H={c.hidden_size} A={c.num_heads} V={c.vocab_size}"
          f"{' causal' if c.causal else ''}; missing heads: {', '.join(loaded.missing_heads) or 'none'}")
    print(f"{'output':<12} {'max |diff|':>12}")
    for name, diff in rows:
        print(f"{name:<12} {diff:>12.3e}{'  > tol' if diff > tol else ''}")
    worst = max(diff for _, diff in rows)
    print(f"{'OK' if worst <= tol else 'FAIL'}: max |diff| {worst:.3e} (tol {tol:g})")
    return 0 if worst <= tol else 1


def task_module(path: Path, strict: bool = True):
    """The fine-tuned task LightningModule saved in ``path`` (our .ckpt), or None when it holds a
    pre-training model. The class is the task module whose constructor arguments are exactly the saved
    hyper-parameters (``save_hyperparameters`` stores every one); none such is an error, or None when not
    ``strict``."""
    if not path.is_file() or path.suffix in (".json", ".safetensors", ".bin", ".index"):
        return None
    ckpt = safe_torch_load(path, what="a readable bert_repro Lightning checkpoint")
    weights = ckpt.get("state_dict", {}) if isinstance(ckpt, dict) else {}
    if not any(k.startswith("model.") and k.split(".")[1] not in ("bert", *HEADS) for k in weights):
        return None
    from bert_repro.tasks.choice import MultipleChoiceModule
    from bert_repro.tasks.classification import SequenceClassificationModule
    from bert_repro.tasks.span import SpanExtractionModule
    from bert_repro.tasks.tagging import TokenTaggingModule

    saved = set(ckpt.get("hyper_parameters", {}))
    for cls in (SequenceClassificationModule, TokenTaggingModule, SpanExtractionModule, MultipleChoiceModule):
        if saved == set(list(inspect.signature(cls.__init__).parameters)[1:]):
            try:
                return cls.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
            # Lightning raises KeyError, RuntimeError ... for a file it cannot restore
            except Exception as err:
                raise CheckpointError(f"{path}: not a {cls.__name__} checkpoint Lightning can restore "
                                      f"({type(err).__name__}: {err})") from None
    if not strict:
        return None
    raise CheckpointError(f"{path}: a fine-tuned checkpoint whose hyper-parameters {sorted(saved)} fit no "
                          "task module (classification, tagging, span, choice)")


def _not_destroying(src: str, out: str) -> None:
    """``out`` replaced whole must not take the export's own source or any run's results with it."""
    target = Path(out).resolve()
    if not target.is_dir():
        return
    source = Path(src).resolve()
    if source == target or target in source.parents:
        raise FileExistsError(f"{out} holds the checkpoint being exported ({src}); replacing it would delete "
                              "the source: choose an output folder outside it")
    runs = find_runs([target])
    if runs:
        raise FileExistsError(f"{out} holds the results of {len(runs)} run(s) ({runs[0]}"
                              f"{', ...' if len(runs) > 1 else ''}); --force would delete them: choose an "
                              "output folder of its own")


def exported_checkpoint(src: str) -> dict | None:
    """Our ``.ckpt``'s file name, epoch and global step (the model card's); None for another source."""
    if Path(src).suffix != ".ckpt":
        return None
    saved = safe_torch_load(src, what="a readable bert_repro Lightning checkpoint", mmap=True)
    return {"name": Path(src).name, "epoch": saved.get("epoch"), "step": saved.get("global_step")}


def _to_hf(src: str, out: str, encoder_only: bool, force: bool) -> int:
    if force:
        _not_destroying(src, out)
    replaced = sorted(p.name for p in Path(out).iterdir()) if force and Path(out).is_dir() else []
    with fresh_folder(out, force) as new:  # refuses a non-empty folder unless force, before any work
        loaded = load_checkpoint(src)  # its whole model node checked (loaders), whichever path exports it
        module = None if encoder_only else task_module(Path(src))
        if module is not None:
            try:
                architecture = finetuned_architecture(module)
            except ValueError as err:
                raise CheckpointError(f"{src}: {err}") from None
            export_finetuned(module, new)
            identity = getattr(module, "identity", None)
        else:
            model = build_model(loaded, nsp="nsp" not in loaded.missing_heads)
            export_hf(model, new, loaded.vocab, loaded.lowercase is not False, loaded.missing_heads,
                      loaded.identity)
            architecture = ARCHITECTURES[tuple(head not in loaded.missing_heads for head in HEADS)]
            identity = loaded.identity
        write_card(new, architecture, identity, run_results(src), checkpoint=exported_checkpoint(src))
    if replaced:
        print(f"--force: deleted the earlier contents of {out}: {', '.join(replaced)}")
    print(f"wrote {out} ({architecture})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.convert", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compare our encoder with transformers on real sentences")
    check.add_argument("src", help="HF directory, Google TF checkpoint, or our Lightning .ckpt")
    check.add_argument("--tol", type=option(float, lambda v: v >= 0, "a tolerance of 0 or more"),
                       default=1e-4)
    to_hf = sub.add_parser("to-hf", help="export any loadable checkpoint in Hugging Face format; "
                                         "a fine-tuned .ckpt with its task head and label names")
    to_hf.add_argument("src")
    to_hf.add_argument("out_dir")
    to_hf.add_argument("--encoder-only", action="store_true",
                       help="export a fine-tuned checkpoint's encoder without its task head")
    to_hf.add_argument("--force", action="store_true",
                       help="replace OUT_DIR when it is not empty (everything in it is deleted)")
    push = sub.add_parser("push-to-hub", help="upload a folder that to-hf wrote to a Hub repository")
    push.add_argument("folder")
    push.add_argument("repo", help="owner/name on the Hub (created when missing; `hf auth login` first)")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--timeout", type=option(float, lambda v: v > 0, "a positive number of seconds"),
                      default=DEFAULT_S, metavar="SECONDS",
                      help="give up when the Hub has not answered for this long (default %(default)g)")
    args = parser.parse_args(argv)
    from huggingface_hub.errors import HfHubHTTPError

    try:
        if args.command == "check":
            return _check(args.src, args.tol)
        if args.command == "push-to-hub":
            set_deadline(args.timeout, "--timeout=")
            print(f"pushed {args.folder} to {args.repo}: {push_to_hub(args.folder, args.repo, args.private)}")
            return 0
        return _to_hf(args.src, args.out_dir, args.encoder_only, args.force)
    except OSError as err:
        if args.command != "to-hf" or err.errno not in FAULTS:
            print(f"error: {err}", file=sys.stderr)
            return 2
        # a fault of the machine, exit 74 as a run's; the user's folder named, not the temporary one in it
        what, advice = FAULTS[err.errno]
        print(f"error: to-hf {args.out_dir}: {what} {Path(args.out_dir).absolute().parent}: {advice}, or "
              "choose another OUT_DIR; nothing was written", file=sys.stderr)
        return 74
    except (ValueError, ImportError, HfHubHTTPError) as err:  # CheckpointError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Unreachable as err:
        print(f"error: {err}", file=sys.stderr)
        return 69  # as a run (lifecycle/exits.py): sysexits' EX_UNAVAILABLE
