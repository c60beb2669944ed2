"""The scorers, one per metric: GLUE's (glue.py), the official SQuAD v1.1 and v2.0 (squad.py) and CoNLL's
entity F1 (conll.py). A run logs what they compute, and each is also an ``evaluate`` module (modules/) that
calls the same code, so ``evaluate.load(<its file>)`` scores predictions offline as the run does."""
