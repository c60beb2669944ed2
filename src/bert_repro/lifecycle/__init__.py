"""One run's lifecycle, from a composed config to its results: the run folder, its checks, resume, finished
runs, loggers and faults. The science (model, heads, tasks, data, metrics) lives beside this package."""

from bert_repro import config  # noqa: F401 (wherever conf/ is composed, its typed configs are stored)
from bert_repro.lifecycle.hydra_hooks import register_resolvers

register_resolvers()  # wherever conf/ is composed, ${run_name:}, ${run_folder:} ... resolve
