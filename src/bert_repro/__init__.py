"""bert-repro: the BERT paper (Devlin et al.), every table, one command each."""

__version__ = "0.1.0"
