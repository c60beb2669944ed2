"""One run's lifecycle, from a composed config to its results: the run folder, its checks, resume, finished
runs, loggers and faults. The science (model, heads, tasks, data, metrics) lives beside this package."""
