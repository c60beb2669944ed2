"""Benchmark scripts (STYLE 12: speed is a printed ratio against a reference run side by side, never a timed
test). The top layer of the package: they import anything, nothing imports them.

    python -m bert_repro.benchmarks.train_step   # our training step vs transformers' (tokens/s, MFU)
    python -m bert_repro.benchmarks.padding      # dynamic vs fixed 128-token padding on real MRPC/SST-2
    python -m bert_repro.benchmarks.loader       # DataLoader batches/s vs model batches/s
    python -m bert_repro.benchmarks.instances    # instance creation: documents/s and peak memory
    python -m bert_repro.benchmarks.gpu_check    # everything above that needs a GPU, in one go
                                                 # (make gpu-check)
"""
