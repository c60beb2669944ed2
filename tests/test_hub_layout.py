"""The budget-scale pre-training data path on a local mimic of the Hub's `wikimedia/wikipedia` (20231101.en)
and `bookcorpus/bookcorpus` (its auto-converted Parquet branch): the same file layout and schema, a few
parquet shards of real text written here, read through `datasets` with `data_files` as the real run reads
them, streaming and not; phase 2's 512-token instances by the same path."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_repro.data.corpus import gutenberg_documents, wikitext_documents
from bert_repro.data.pretraining import PretrainDataModule

from .conftest import SHARED
from .test_config import compose_cfg, resolved

TEXT = SHARED / "pretrain_text"
# the dataset cards' configs, as on the Hub: load_dataset(path, name) finds the files through them
WIKI_CARD = """---
configs:
- config_name: 20231101.en
  data_files:
  - split: train
    path: 20231101.en/train-*
---
"""
BOOKS_CARD = WIKI_CARD.replace("20231101.en/train-*", "plain_text/train/*").replace("20231101.en",
                                                                                   "plain_text")


def _article(title: str, sentences: list[str]) -> str:
    """A Wikipedia article's `text` as the Hub stores it: paragraphs, a heading, back matter."""
    paragraphs = [" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]
    return "\n\n".join([paragraphs[0], "Career", *paragraphs[1:], "References", "Smith, J. (2001). A book."])


@pytest.fixture(scope="module")
def hub_mirror(tmp_path_factory):
    """<root>/wikimedia/wikipedia and <root>/bookcorpus/bookcorpus, laid out as on the Hub."""
    if not TEXT.is_dir():
        pytest.skip(f"{TEXT} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    root = tmp_path_factory.mktemp("hub")
    wiki = root / "wikimedia" / "wikipedia"
    (wiki / "20231101.en").mkdir(parents=True)
    (wiki / "README.md").write_text(WIKI_CARD)
    articles = [d for d in wikitext_documents(TEXT / "wikitext-2-raw" / "wiki.test.raw") if len(d) > 4][:24]
    for shard in range(2):
        rows = [{"id": str(i), "url": f"https://en.wikipedia.org/wiki?curid={i}", "title": f"Article {i}",
                 "text": _article(f"Article {i}", articles[i])} for i in range(shard, len(articles), 2)]
        shard_file = wiki / "20231101.en" / f"train-0000{shard}-of-00002.parquet"
        pq.write_table(pa.Table.from_pylist(rows), shard_file)
    books = root / "bookcorpus" / "bookcorpus" / "plain_text" / "train"
    books.mkdir(parents=True)
    (root / "bookcorpus" / "bookcorpus" / "README.md").write_text(BOOKS_CARD)
    sentences = [s.lower() for d in gutenberg_documents(TEXT / "gutenberg" / "11.txt") for s in d][:2000]
    for shard in range(2):
        pq.write_table(pa.table({"text": sentences[shard * 1000 : (shard + 1) * 1000]}),
                       books / f"{shard:04d}.parquet")
    return root


def _budget_data(root, overrides=()) -> dict:
    """scale=budget's `data:` node, each Hub dataset read from the mirror: only the path (and the git
    revision, which a local folder has not) differs from the real run."""
    data = resolved(compose_cfg(["experiment=pretrain_phase1", "scale=budget", *overrides]))["data"]
    data["hub"] = [{**entry, "path": str(root / entry["path"]), "revision": None} for entry in data["hub"]]
    return data


@pytest.mark.e2e
@pytest.mark.parametrize("streaming", [False, True])
def test_budget_data_path_on_the_hub_layout(hub_mirror, tmp_path, streaming):
    data = _budget_data(hub_mirror)
    assert all(entry["data_files"] for entry in data["hub"])  # the real run reads these files too
    data["hub"] = [{**entry, "streaming": streaming} for entry in data["hub"]]
    settings = {k: v for k, v in data.items() if k != "_target_"}
    dm = PretrainDataModule(**{**settings, "vocab_size": 2000, "dupe_factor": 2, "cache_dir": str(tmp_path)})
    dm.setup()
    train = dm.train_set
    assert len(train) > 200 and set(train["dupe"]) == {0, 1}
    vocab = dm.vocab
    texts = [" ".join(vocab[i] for i in ids) for ids in train["input_ids"][:400]]
    assert not any("references" in t.split() for t in texts)  # back matter dropped (§3.4 text passages only)
    assert max(len(ids) for ids in train["input_ids"]) == 128
    assert max(len(p) for p in train["masked_lm_positions"]) == round(0.15 * 128)  # <= 20 predictions


@pytest.mark.e2e
def test_phase2_instances_by_the_same_path(hub_mirror, tmp_path):
    data = _budget_data(hub_mirror, ["experiment=pretrain_phase2", "ckpt_path=unused.ckpt"])
    settings = {k: v for k, v in data.items() if k not in ("_target_", "tokenizer")}
    assert (settings["max_seq_length"], settings["max_predictions_per_seq"]) == (512, 80)
    dm = PretrainDataModule(**{**settings, "vocab_size": 2000, "dupe_factor": 1, "cache_dir": str(tmp_path)})
    dm.setup()
    lengths = [len(ids) for ids in dm.train_set["input_ids"]]
    assert max(lengths) == 512
    assert max(len(p) for p in dm.train_set["masked_lm_positions"]) == round(0.15 * 512)  # <= 80
