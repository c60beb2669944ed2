"""bert-repro: the BERT paper (Devlin et al.), every table, one command each."""

from bert_repro.config import register as _register_schemas

__version__ = "0.1.0"
# conf/ composes the typed configs (config.py): wherever conf/ is composed, they are there
_register_schemas()
