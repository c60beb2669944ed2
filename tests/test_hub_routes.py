"""Every fine-tuning data set the task configs name on the Hub, read by the pinned `datasets` through a local
copy of that repository's real file layout (the parquet files where the Hub keeps them, the configs in its
README's YAML, the features in the files' metadata, as the Hub's converter writes them): only the path
differs from a run on the Hub. tests/test_hub_layout.py does the same for the pre-training corpora."""

import json

import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from bert_repro.data.conll import CONLL2003_LABELS, ConllDataModule, read_conll
from bert_repro.data.squad import EXAMPLE_FEATURES, SquadDataModule, read_squad_json
from bert_repro.data.swag import SwagDataModule

from .test_config import compose_cfg, resolved


def _hub(task: str) -> dict:
    return resolved(compose_cfg([f"task={task}"]))["data"]["hub"]


def _card(configs: dict[str, dict[str, str]]) -> str:
    """A dataset card whose YAML lists each config's split -> file pattern, as the Hub's do."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {pattern}" for split, pattern in splits.items()]
    return "\n".join([*lines, "---", ""])


def _local(root, hub: dict) -> dict:
    """The config's entry, read from the copy: the path is the folder (a local folder has no revision)."""
    return {**hub, "path": str(root / hub["path"]), "revision": None}


@pytest.mark.slow
def test_conll2003_reads_from_the_parquet_export(tmp_path, minilm_dir):
    """eriktks/conll2003 keeps a loading script on main; its Parquet export (refs/convert/parquet) is
    <config>/<split>/0000.parquet, no card, ClassLabel names in the files' metadata."""
    hub = _hub("conll2003")
    assert hub["path"] == "eriktks/conll2003" and hub["revision"] == "refs/convert/parquet"
    from .test_conll_data import SAMPLE, write_dir

    sentences = read_conll(write_dir(tmp_path, SAMPLE, SAMPLE) / "eng.train")
    tags = ClassLabel(names=CONLL2003_LABELS)
    features = Features({"id": Value("string"), "tokens": Sequence(Value("string")),
                         "pos_tags": Sequence(Value("int32")), "chunk_tags": Sequence(Value("int32")),
                         "ner_tags": Sequence(tags)})
    # the Hub copy is IOB2 already; the reader turns IOB1 to IOB2 either way
    rows = {"id": [str(i) for i in range(len(sentences["tokens"]))], "tokens": sentences["tokens"],
            "pos_tags": [[0] * len(t) for t in sentences["tokens"]],
            "chunk_tags": [[0] * len(t) for t in sentences["tokens"]],
            "ner_tags": [[tags.str2int(t) for t in s] for s in sentences["tags"]]}
    repository = tmp_path / "eriktks" / "conll2003"
    for split in ("train", "validation", "test"):
        (repository / "conll2003" / split).mkdir(parents=True)
        shard = repository / "conll2003" / split / "0000.parquet"
        Dataset.from_dict(rows, features=features).to_parquet(shard)
    data = ConllDataModule(None, hub=_local(tmp_path, hub), tokenizer=str(minilm_dir), lowercase=True,
                           document_context=False, cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert data.sentences["dev"]["tags"] == sentences["tags"] and data.test_splits == ["test"]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.slow
def test_squad_reads_from_its_parquet_repository(tmp_path, shared_data, minilm_dir, version):
    """rajpurkar/squad (config plain_text) and rajpurkar/squad_v2 (config squad_v2): one parquet file per
    split under the config's folder, named in the card."""
    hub = _hub(f"squad_v{version}")
    folder = {1: "plain_text", 2: "squad_v2"}[version]
    assert hub["path"] == {1: "rajpurkar/squad", 2: "rajpurkar/squad_v2"}[version]
    official = {1: "squad_v1/dev-v1.1.json", 2: "squad_v2/dev-v2.0.json"}[version]
    rows = read_squad_json(shared_data / official, version)[:20]
    repository = tmp_path / hub["path"]
    (repository / folder).mkdir(parents=True)
    (repository / "README.md").write_text(_card({folder: {"train": f"{folder}/train-*",
                                                         "validation": f"{folder}/validation-*"}}))
    for split in ("train", "validation"):
        Dataset.from_list(rows, features=EXAMPLE_FEATURES).to_parquet(
            repository / folder / f"{split}-00000-of-00001.parquet")
    data = SquadDataModule(version, squad_dir=None, hub=_local(tmp_path, hub), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "cache"), max_seq_length=128, doc_stride=32)
    data.setup()
    assert data.examples["dev"]["id"] == [r["id"] for r in rows]


@pytest.mark.slow
def test_swag_reads_its_regular_config(tmp_path, shared_data, minilm_dir):
    """allenai/swag: configs `full` and `regular` in the card; `regular` has train, validation and test
    (labels -1) under regular/."""
    hub = _hub("swag")
    assert (hub["path"], hub["name"]) == ("allenai/swag", "regular")
    sample = (shared_data / "swag" / "transformers_fixture" / "sample.json").read_text()
    rows = [json.loads(line) for line in sample.splitlines() if line]
    repository = tmp_path / "allenai" / "swag"
    for config in ("regular", "full"):
        (repository / config).mkdir(parents=True)
    (repository / "README.md").write_text(_card({
        "full": {"train": "full/train-*", "validation": "full/validation-*"},
        "regular": {split: f"regular/{split}-*" for split in ("train", "validation", "test")}}))
    for split in ("train", "validation", "test"):
        split_rows = [{**r, "label": -1} for r in rows] if split == "test" else rows
        Dataset.from_list(split_rows).to_parquet(repository / "regular" / f"{split}-00000-of-00001.parquet")
        Dataset.from_list(rows[:2]).to_parquet(repository / "full" / f"{split}-00000-of-00001.parquet")
    data = SwagDataModule(None, hub=_local(tmp_path, hub), tokenizer=str(minilm_dir),
                          cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert data.datasets["dev"]["label"] == [r["label"] for r in rows] and data.test_splits == ["test"]
