"""The scorers as ``evaluate`` modules, one file each, loaded offline from the installed package:
``evaluate.load(str(importlib.resources.files("bert_repro.metrics.modules") / "squad_v1.py"))``; glue.py
takes the task as its config name. Each calls the code the run scores with, so ``compute`` gives what the run
logs (without the ``val/`` prefix)."""
